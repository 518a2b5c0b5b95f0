// Long requests in parts: a submission's writing, a clean, a restart each hold gpuqd's thread for
// at most k_part at a time and go on at a later turn of its loop, so that no client waits behind a
// 100,000-job request for more than a part's time.
#pragma once

#include <chrono>
#include <functional>

namespace boost::asio {
class io_context;
}

namespace gpuq::daemon {

// How long one part of a long request may hold gpuqd's thread.
inline constexpr auto k_part = std::chrono::milliseconds(10);

// A store write that failed (a launch, a job's end, a later part of a restart) is tried again
// after this long.
inline constexpr double k_write_retry_s = 5;

// The end of a part begun now: now + k_part, or sooner under the test hook below (parts of 64 jobs).
std::chrono::steady_clock::time_point part_deadline();
// The test hook is set ($GPUQ_TEST_PAUSE_PARTS): parts of 64 jobs.
bool parts_hooked();
// Test hook ($GPUQ_TEST_PAUSE_PARTS=PATH): while PATH exists no long request goes on past its
// first part, and PATH.reached exists, so a test can look at gpuqd in the middle of one. `resume`
// is called on `io` once PATH is gone (polled every 10 ms). False: no pause, go on.
bool paused_between_parts(boost::asio::io_context& io, std::function<void()> resume);

}  // namespace gpuq::daemon
