#include <openssl/evp.h>

#include <array>

#include "amp/sink/target.hpp"
#include "amp/timestamp.hpp"
#include "sink/targets.hpp"

namespace amp::sink {
namespace {

constexpr std::size_t k_max_name = 200;
constexpr std::size_t k_kept_prefix = 120;

bool kept(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.';
}

void append_hex(std::string& out, unsigned char byte) {
  constexpr char k_digits[] = "0123456789ABCDEF";
  out.push_back(k_digits[byte >> 4]);
  out.push_back(k_digits[byte & 0xf]);
}

}  // namespace

std::string safe_file_name(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (std::size_t i = 0; i < key.size(); ++i) {
    const char c = key[i];
    if (kept(c) && !(i == 0 && c == '.')) {
      out.push_back(c);
    } else {
      out.push_back('%');
      append_hex(out, static_cast<unsigned char>(c));
    }
  }
  if (out.empty()) return "%";  // no key is empty; the name still must not be
  if (out.size() <= k_max_name) return out;
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int length = 0;
  EVP_Digest(key.data(), key.size(), md.data(), &length, EVP_sha256(), nullptr);
  out.resize(k_kept_prefix);
  out.push_back('~');
  for (unsigned int i = 0; i < length; ++i) {
    append_hex(out, md[i]);
  }
  return out;
}

result<std::unique_ptr<target>> make_target(const target_config& config) {
  switch (config.kind) {
    case target_kind::file:
      if (config.dir.empty()) break;
      return detail::make_file_target(config);
    case target_kind::sqlite:
      if (config.path.empty() || config.table.empty()) break;
      return detail::make_sqlite_target(config);
    case target_kind::postgres:
      if (config.dsn.empty() || config.table.empty()) break;
      return detail::make_postgres_target(config);
  }
  return unexpected(errc::bad_request,
                    std::string("a ") + std::string(to_string(config.kind)) + " target needs " +
                        (config.kind == target_kind::file     ? "dir"
                         : config.kind == target_kind::sqlite ? "path and table"
                                                              : "dsn and table"));
}

namespace detail {

std::string committed_now() {
  return format_timestamp(std::chrono::system_clock::now());
}

}  // namespace detail
}  // namespace amp::sink
