// Users' requests taking turns on gpuqd's thread (daemon/turns.hpp).
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/turns.hpp"

using gpuq::daemon::Turns;

TEST_CASE("each user with requests waiting is served one in turn, each user's in the order they came") {
  boost::asio::io_context io;
  auto turns = std::make_shared<Turns>(io.get_executor());
  std::vector<std::string> ran;
  auto request = [&](uid_t uid, int n) {
    turns->add(uid, [&ran, uid, n] { ran.push_back(std::to_string(uid) + "." + std::to_string(n)); });
  };
  // One user's five requests are read first (its connections were accepted first), then two others'.
  for (int n = 1; n <= 5; ++n)
    request(1001, n);
  request(1002, 1);
  request(0, 1);
  CHECK(turns->waiting() == 7);
  io.run();
  CHECK(ran == std::vector<std::string>{"1001.1", "1002.1", "0.1", "1001.2", "1001.3", "1001.4", "1001.5"});
  CHECK(turns->waiting() == 0);
}

TEST_CASE("requests run from handlers of their own: other work on the thread runs between them") {
  boost::asio::io_context io;
  auto turns = std::make_shared<Turns>(io.get_executor());
  std::vector<std::string> ran;
  for (int n = 1; n <= 3; ++n)
    turns->add(1001, [&ran, n] { ran.push_back("request " + std::to_string(n)); });
  boost::asio::post(io, [&] { ran.push_back("a read"); });
  // A request that queues work of its own (a part of a long reply) lets the next turn go first.
  turns->add(1002, [&] {
    ran.push_back("request of 1002");
    boost::asio::post(io, [&] { ran.push_back("its next part"); });
  });
  io.run();
  CHECK(ran ==
        std::vector<std::string>{"request 1", "a read", "request of 1002", "request 2", "its next part", "request 3"});
}

TEST_CASE("a user whose queue emptied comes back at the end of the rotation") {
  boost::asio::io_context io;
  auto turns = std::make_shared<Turns>(io.get_executor());
  std::vector<uid_t> ran;
  for (int n = 0; n < 2; ++n)
    turns->add(7, [&] { ran.push_back(7); });
  turns->add(8, [&] {
    ran.push_back(8);
    turns->add(9, [&] { ran.push_back(9); });  // arrives while 7 still waits
    turns->add(8, [&] { ran.push_back(8); });
  });
  io.run();
  CHECK(ran == std::vector<uid_t>{7, 8, 7, 9, 8});
}
