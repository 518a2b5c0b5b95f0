// How gpuqd answers a request: Reply sends one reply line's JSON; Later<R> is a reply given later
// (a wait, a request done in parts) that can only be an R, the reply type the command is bound
// to in common/protocol.hpp, or an error. The owners that finish such requests hold a Later.
#pragma once

#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/protocol.hpp"

namespace gpuq::daemon {

using Reply = std::function<void(nlohmann::json)>;

template <class R>
class Later {
 public:
  Later() = default;
  // From a Reply or a lambda of the JSON (a test's); never from another Later, which a JSON
  // value would also call (it converts to R), wrapping one reply in another.
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, Later> && std::is_convertible_v<F, Reply>) Later(F send)
      : m_send(std::move(send)) {}  // NOLINT: implicit by design
  void operator()(const R& reply) const { m_send(common::ok_reply(reply)); }
  void fail(const Error& e) const { m_send(common::error_reply(e)); }
  void fail(ErrorCode code, const std::string& message) const { m_send(common::error_reply(code, message)); }
  // False for none (a restart resumed at start answers nobody).
  explicit operator bool() const { return static_cast<bool>(m_send); }

 private:
  Reply m_send;
};

}  // namespace gpuq::daemon
