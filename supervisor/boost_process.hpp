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
