// Boost.Process's original (v1) API, which gpuq's launcher (gpuqd) and supervisor (gpuq-shim) use, as `gpuq::bp`. Boost
// 1.88 made v2 the default behind <boost/process.hpp> and moved v1 to <boost/process/v1/...>,
// namespace boost::process::v1; older Boosts have it at the top level.
#pragma once

#include <boost/version.hpp>

#if BOOST_VERSION >= 108800
#include <boost/process/v1.hpp>
#include <boost/process/v1/extend.hpp>
#include <boost/process/v1/posix.hpp>
namespace gpuq {
namespace bp = boost::process::v1;
}
#else
#include <boost/process.hpp>
#include <boost/process/extend.hpp>
#include <boost/process/posix.hpp>
namespace gpuq {
namespace bp = boost::process;
}
#endif

namespace gpuq {
// A child's whole environment as an envp array, handed to the executor before it forks (instead
// of bp::env: Boost 1.74's bp::environment reads past shorter entries when it looks a name up,
// which ASan finds). `envp` must outlive the launch.
struct EnvSetup : bp::extend::handler {
  char** envp;
  explicit EnvSetup(char** e) : envp(e) {}
  template <class Executor>
  void on_setup(Executor& e) const {
    e.env = envp;
  }
};
}  // namespace gpuq

