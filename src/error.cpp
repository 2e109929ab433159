#include "amp/error.hpp"

#include <array>

namespace amp {
namespace {

constexpr std::array<std::string_view, 15> k_names{"",
                                                   "bad_request",
                                                   "unauthenticated",
                                                   "forbidden",
                                                   "invalid_name",
                                                   "invalid_envelope",
                                                   "payload_too_large",
                                                   "not_found",
                                                   "conflict",
                                                   "lease_lost",
                                                   "rate_limited",
                                                   "budget_exhausted",
                                                   "limit_exceeded",
                                                   "unavailable",
                                                   "internal"};

class category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "amp"; }
  std::string message(int ev) const override {
    if (ev <= 0 || ev >= static_cast<int>(k_names.size())) return "unknown amp error";
    return std::string(k_names[static_cast<std::size_t>(ev)]);
  }
};

}  // namespace

const std::error_category& amp_category() noexcept {
  static const category instance;
  return instance;
}

std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), amp_category()};
}

std::string_view to_string(errc e) noexcept {
  auto i = static_cast<std::size_t>(e);
  return i < k_names.size() ? k_names[i] : std::string_view("internal");
}

std::optional<errc> errc_from_string(std::string_view code) noexcept {
  for (std::size_t i = 1; i < k_names.size(); ++i) {
    if (k_names[i] == code) return static_cast<errc>(i);
  }
  return std::nullopt;
}

std::string error::to_string() const {
  std::string s(amp::to_string(code_));
  s += ": ";
  s += message_;
  return s;
}

}  // namespace amp
