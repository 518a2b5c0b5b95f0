// Long requests in parts (parts.hpp): the deadline of a part, and the test hook that pauses them.
#include "daemon/parts.hpp"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded
#include <boost/asio.hpp>

#include "common/paths.hpp"

namespace gpuq::daemon {

bool paused_between_parts(boost::asio::io_context& io, std::function<void()> resume) {
  const char* path = std::getenv("GPUQ_TEST_PAUSE_PARTS");
  if (!path || !*path || !common::path_exists(path)) return false;
  if (!common::path_exists(std::string(path) + ".reached")) std::ofstream(std::string(path) + ".reached").put('\n');
  auto timer = std::make_shared<boost::asio::steady_timer>(io, std::chrono::milliseconds(10));
  timer->async_wait([timer, resume = std::move(resume)](const boost::system::error_code& ec) {
    if (!ec) resume();
  });
  return true;
}

std::chrono::steady_clock::time_point part_deadline() {
  return parts_hooked() ? std::chrono::steady_clock::time_point::min() : std::chrono::steady_clock::now() + k_part;
}

bool parts_hooked() {
  static const bool hooked = std::getenv("GPUQ_TEST_PAUSE_PARTS") != nullptr;
  return hooked;
}

}  // namespace gpuq::daemon
