// Job matrices: one spec that stands for the cartesian product of some values, as a CI matrix or
// a Slurm job array with parameters. `"matrix": {"lr": [0.1, 0.3], "hidden": [64, 128]}` makes
// four jobs; in each, `{lr}` and `{hidden}` in any string of the spec become that job's values:
// their text in the fields made of strings (name, command, shell, env, labels, cwd, after);
// elsewhere (train, gpus, priority, …) a string that is exactly `{lr}` becomes the value itself,
// so `"lr": "{lr}"` in a train section is a number (a value may also be a list, e.g. layer sizes
// [256, 128]; its text is the JSON). `${lr}` is left alone for the shell. Each job also gets a
// label per key, and a name without placeholders gets the values appended ("sweep" ->
// "sweep-64-0.1"). An `after` naming a matrix job waits for all of its jobs. Expansion happens
// before the strict parse, so every expanded job is checked like any other.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace gpuq::common {

// A job object or an array of them, with every job that has a `matrix` replaced by its jobs, in
// order (keys alphabetically, the last varying fastest). Jobs without one pass through unchanged.
// Errors name the job and the field; at most `max_jobs` jobs may result.
Result<nlohmann::json> expand_matrices(const nlohmann::json& doc, std::size_t max_jobs);

}  // namespace gpuq::common
