// How gpuqd answers a request: Reply sends one reply line's JSON; Later<R> is a reply given later
// (a wait, a request done in parts) that can only be an R, the reply type the command is bound
// to in common/protocol.hpp, or an error, and is sent once. The owners that finish such requests
// hold a Later.
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
class Later;
template <class T>
struct is_later : std::false_type {};
template <class R>
struct is_later<Later<R>> : std::true_type {};

template <class R>
class Later {
 public:
  Later() = default;
  // From a Reply or a lambda of the JSON (a test's). Never from a Later, of this type or another:
  // a JSON value converts to any reply type, so one Later would call another, and an error
  // passed through would come out read as an empty success.
  template <class F>
  requires(!is_later<std::remove_cvref_t<F>>::value && std::is_convertible_v<F, Reply>) Later(F send)
      : m_send(std::move(send)) {}  // NOLINT: implicit by design
  // Moved, not copied: one request, one Later. A moved-from Later is empty.
  Later(Later&& other) noexcept : m_send(std::exchange(other.m_send, nullptr)) {}
  Later& operator=(Later&& other) noexcept {
    m_send = std::exchange(other.m_send, nullptr);
    return *this;
  }
  Later(const Later&) = delete;
  Later& operator=(const Later&) = delete;

  // Each sends the reply and empties the Later: a second answer sends nothing.
  void operator()(const R& reply) { send(common::ok_reply(reply)); }
  void fail(const Error& e) { send(common::error_reply(e)); }
  void fail(ErrorCode code, const std::string& message) { send(common::error_reply(code, message)); }
  // False once answered or moved from (a restart resumed at start answers nobody).
  explicit operator bool() const { return static_cast<bool>(m_send); }
  // The Reply inside, taking it out (a handler that refused before it took the Later).
  Reply release() { return std::exchange(m_send, nullptr); }

 private:
  void send(nlohmann::json j) {
    if (auto to = std::exchange(m_send, nullptr)) to(std::move(j));
  }
  Reply m_send;
};

}  // namespace gpuq::daemon
