#include <atomic>

#include "amp/transport/memory.hpp"
#include "conformance/fixture.hpp"

namespace amp::conformance {
namespace {

class memory_fixture final : public fixture {
 public:
  memory_fixture()
      : clock_(std::make_shared<manual_clock>()),
        transport_(memory_transport::create({.clock = clock_, .on_handler_error = error_sink()})) {}

  amp::transport& transport() override { return *transport_; }
  std::shared_ptr<amp::transport> shared_transport() override { return transport_; }
  void advance(amp::duration d) override { clock_->advance(d); }
  std::string unique(std::string_view base) override {
    static std::atomic<int> counter{0};
    return std::string(base) + "_" + std::to_string(++counter);
  }
  bool real_time() const override { return false; }

 private:
  std::shared_ptr<manual_clock> clock_;
  std::shared_ptr<amp::transport> transport_;
};

}  // namespace

std::unique_ptr<fixture> make_fixture() {
  return std::make_unique<memory_fixture>();
}

}  // namespace amp::conformance
