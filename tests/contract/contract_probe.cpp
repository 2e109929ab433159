// The C++ side of the contract check (contract.test.js): answers, from names.hpp and
// subjects.hpp themselves, what the contract asyncapi/amp.yaml claims of them.
//
// Reads one JSON object from stdin:
//   {"names": {"<token type>": ["value", …], …},
//    "addresses": [{"ns", "participant", "job", "topic", "pattern", "sink", "task",
//                   "operation", "gateway", "digest", "day"}, …]}
// and writes one JSON object to stdout:
//   {"names": {"<token type>": [true|false, …], …}   names.hpp's verdict on each value
//    "generated": {"TaskId": […], "OperationId": […], "Gateway": […]}   ids as the broker
//                                                                        makes them
//    "addresses": [{"<channel>.<what>": "…", …}, …]}   what subjects.hpp builds
// where <what> is `address`, `stream.name`, `consumer`, `bucket`, `key` or
// `filters.<name>`, as in the contract's x-nats-contract. Exit status 2 on bad input.
#include <simdjson.h>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include "amp/json.hpp"
#include "amp/names.hpp"
#include "amp/subjects.hpp"
#include "broker/common.hpp"
#include "transport/jetstream/codec.hpp"

namespace {

template <class Name>
bool valid(std::string_view value) {
  return Name::make(value).has_value();
}

const std::map<std::string, std::function<bool(std::string_view)>, std::less<>> verdicts = {
    {"Namespace", valid<amp::namespace_name>},
    {"Participant", valid<amp::participant_name>},
    {"Job", valid<amp::job_name>},
    {"Sink", valid<amp::sink_name>},
    {"Topic", valid<amp::topic>},
    {"TopicPattern", valid<amp::topic_pattern>},
    {"TaskId", valid<amp::task_id>},
    {"OperationId", valid<amp::operation_id>},
};

std::string text_of(simdjson::dom::object tuple, const char* field) {
  std::string_view text;
  if (tuple[field].get_string().get(text)) throw std::runtime_error(std::string("no ") + field);
  return std::string(text);
}

template <class Name>
Name must(simdjson::dom::object tuple, const char* field) {
  auto made = Name::make(text_of(tuple, field));
  if (!made) throw std::runtime_error(made.error().message());
  return *std::move(made);
}

// Everything subjects.hpp builds for one set of parameters, by the contract's keys.
std::map<std::string, std::string> addresses(simdjson::dom::object tuple) {
  namespace s = amp::subjects;
  using amp::jetstream_detail::kv_subject;
  const auto ns = must<amp::namespace_name>(tuple, "ns");
  const auto participant = must<amp::participant_name>(tuple, "participant");
  const auto job = must<amp::job_name>(tuple, "job");
  const auto topic = must<amp::topic>(tuple, "topic");
  const auto pattern = must<amp::topic_pattern>(tuple, "pattern");
  const auto sink = must<amp::sink_name>(tuple, "sink");
  const auto task = must<amp::task_id>(tuple, "task");
  const auto operation = must<amp::operation_id>(tuple, "operation");
  const auto gateway = text_of(tuple, "gateway");
  const auto digest = text_of(tuple, "digest");
  const auto day = text_of(tuple, "day");
  return {
      {"inbox.address", s::inbox_subject(ns, participant)},
      {"inbox.filters.stream", s::inbox_subjects(ns)},
      {"inbox.stream.name", s::inbox_stream(ns)},
      {"inbox.consumer", s::inbox_consumer(participant)},
      {"job.address", s::job_subject(ns, job)},
      {"job.filters.stream", s::job_subjects(ns)},
      {"job.stream.name", s::tasks_stream(ns)},
      {"job.consumer", s::job_consumer(job)},
      {"topic.address", s::topic_subject(ns, topic)},
      {"topic.filters.stream", s::topic_subjects(ns)},
      {"topic.filters.bySubscription", s::topic_filter(ns, pattern)},
      {"topic.stream.name", s::topics_stream(ns)},
      {"taskEnded.address", s::ended_subject(ns)},
      {"taskEnded.stream.name", s::ended_stream(ns)},
      {"taskEnded.consumer", s::sweeper_consumer()},
      {"operationDue.address", s::operation_due_subject(ns)},
      {"operationDue.stream.name", s::operations_stream(ns)},
      {"operationDue.consumer", s::deadlines_consumer()},
      {"dlq.address", s::dlq_subject(ns, sink)},
      {"dlq.filters.stream", s::dlq_subjects(ns)},
      {"dlq.stream.name", s::dlq_stream(ns)},
      {"taskControl.address", s::task_control_subject(ns)},
      {"operationControl.address", s::operation_control_subject(ns)},
      {"inboxControl.address", s::inbox_control_subject(ns, participant)},
      {"inboxControl.filters.all", s::inbox_control_subjects(ns)},
      {"workControl.address", s::work_control_subject(ns)},
      {"workOffer.address", s::work_offer_subject(ns, gateway)},
      {"registryEntry.address", kv_subject(s::registry_bucket(ns), s::registry_key(participant))},
      {"registryEntry.bucket", s::registry_bucket(ns)},
      {"registryEntry.key", s::registry_key(participant)},
      {"taskRecord.address", kv_subject(s::task_state_bucket(), s::task_key(ns, task))},
      {"taskRecord.bucket", s::task_state_bucket()},
      {"taskRecord.key", s::task_key(ns, task)},
      {"operationRecord.address",
       kv_subject(s::task_state_bucket(), s::operation_key(ns, operation))},
      {"operationRecord.bucket", s::task_state_bucket()},
      {"operationRecord.key", s::operation_key(ns, operation)},
      {"idempotencyBinding.address",
       kv_subject(s::task_state_bucket(), s::idempotency_key(ns, digest))},
      {"idempotencyBinding.bucket", s::task_state_bucket()},
      {"idempotencyBinding.key", s::idempotency_key(ns, digest)},
      {"budgetCounter.address",
       kv_subject(s::budget_bucket(), s::budget_key(ns, participant, day))},
      {"budgetCounter.bucket", s::budget_bucket()},
      {"budgetCounter.key", s::budget_key(ns, participant, day)},
  };
}

void write_generated(amp::json_writer& w) {
  const auto now = std::chrono::system_clock::now();
  w.key("generated").begin_object();
  for (auto [type, prefix] :
       {std::pair{"TaskId", "t_"}, std::pair{"OperationId", "o_"}, std::pair{"Gateway", "g"}}) {
    w.key(type).begin_array();
    for (int i = 0; i < 200; ++i) w.string(amp::detail::unique_id(prefix, now));
    w.end_array();
  }
  w.end_object();
}

int run() {
  const std::string input{std::istreambuf_iterator<char>(std::cin),
                          std::istreambuf_iterator<char>()};
  simdjson::dom::parser parser;
  simdjson::dom::object doc;
  if (parser.parse(input).get_object().get(doc)) {
    std::cerr << "contract-probe: stdin is not a JSON object\n";
    return 2;
  }
  amp::json_writer w;
  w.begin_object().key("names").begin_object();
  simdjson::dom::object names;
  if (doc["names"].get_object().get(names)) {
    std::cerr << "contract-probe: no names\n";
    return 2;
  }
  for (auto [type, values] : names) {
    auto check = verdicts.find(type);
    simdjson::dom::array list;
    if (check == verdicts.end() || values.get_array().get(list)) {
      std::cerr << "contract-probe: unknown token type or not a list: " << type << "\n";
      return 2;
    }
    w.key(type).begin_array();
    for (auto value : list) {
      std::string_view text;
      if (value.get_string().get(text)) {
        std::cerr << "contract-probe: a name that is not a string\n";
        return 2;
      }
      w.boolean(check->second(text));
    }
    w.end_array();
  }
  w.end_object();
  write_generated(w);
  w.key("addresses").begin_array();
  simdjson::dom::array tuples;
  if (doc["addresses"].get_array().get(tuples)) {
    std::cerr << "contract-probe: no addresses\n";
    return 2;
  }
  for (auto tuple : tuples) {
    simdjson::dom::object o;
    if (tuple.get_object().get(o)) {
      std::cerr << "contract-probe: an address tuple that is not an object\n";
      return 2;
    }
    w.begin_object();
    for (const auto& [key, value] : addresses(o)) w.key(key).string(value);
    w.end_object();
  }
  w.end_array().end_object();
  std::cout << w.str() << "\n";
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::cerr << "contract-probe: " << e.what() << "\n";
    return 2;
  }
}
