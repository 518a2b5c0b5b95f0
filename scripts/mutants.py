#!/usr/bin/env python3
"""Mutation check of the guards that matter (scripts/mutants.sh runs this; docs/reliability.md).

Each mutant removes or weakens one guard: an exact snippet of one source file, replaced. The
script keeps a copy of the tree in a scratch directory (unchanged files keep their times),
builds it once without LibTorch, and then for each mutant applies it, builds incrementally (one
translation unit and a link: tens of seconds), runs the tests that must kill it, and puts the file
back. A mutant whose tests still pass SURVIVED: a guard no test guards. A snippet that is no longer
in its file is an error (the code moved: update the table). Exit status: 0 when every mutant was
killed, 1 otherwise.

  scripts/mutants.sh                 # all of them
  scripts/mutants.sh restart fds     # those whose names contain a word given
  GPUQ_MUTANT_DIR=/var/tmp/m scripts/mutants.sh   # where the copy and its build live
  scripts/mutants.py --check build/bin # the table alone (a CTest entry): every snippet is in its
                                       # file once, every test named exists; builds nothing
"""
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.environ.get("GPUQ_MUTANT_DIR", "/tmp/gpuq-mutants")
SRC, BUILD = os.path.join(WORK, "src"), os.path.join(WORK, "build")

# (name, file, snippet, replacement, tests); for a guard that takes several edits to remove (two
# layers, each covering for the other), (name, file, [(snippet, replacement), ...], None, tests)
# or, across files, (name, None, [(file, snippet, replacement), ...], None, tests). Tests: unittest names (integration,
# run from tests/integration) or "unit:<doctest test-case pattern>".
MUTANTS = [
    ("restart-authorize", "daemon/restart.cpp",
     '    m_needs.reads().authorize(caller, named.back(), "restart");\n', "\n",
     ["test_lab.LabMode.test_another_users_job_cannot_be_touched_and_an_admin_may"]),
    ("details-visibility", "daemon/users.cpp",
     "  return viewer.admin || viewer.uid == owner;\n", "  return viewer.admin || viewer.uid == owner || true;\n",
     ["test_lab.LabMode.test_one_visibility_rule_for_every_command_owner_other_user_and_admin"]),
    ("events-file-owner", "daemon/event_tick.cpp",
     "!S_ISREG(st.st_mode) || st.st_uid != a.rec.uid) st.st_size = 0;",
     "!S_ISREG(st.st_mode)) st.st_size = 0;",
     ["test_lab.LabMode.test_a_job_cannot_make_gpuqd_read_a_file_its_owner_cannot"]),
    ("job-file-nofollow", "common/json_input.cpp",
     "int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);",
     "int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);",
     ["test_lab.LabMode.test_reading_a_jobs_log_follows_no_link_and_waits_on_no_fifo_as_root_an_admin_or_its_owner"]),
    ("no-new-privs", "supervisor/supervisor.cpp",
     "    return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0;\n", "    return true;\n",
     ["test_lab.LabMode.test_jobs_run_as_their_owner_with_their_home_and_files"]),
    ("readopt-owner", "daemon/local_executor.cpp",
     "if (pid && is_alive(*pid) && common::process_owner(pid->pid) == ::geteuid() && supervises(pid->pid, attempt)) {",
     "if (pid && is_alive(*pid) && supervises(pid->pid, attempt)) {",
     ["test_lab.LabMode.test_a_pid_file_pointed_at_a_process_not_its_supervisor_is_never_taken_or_signalled"]),
    ("readopt-is-its-supervisor", "daemon/local_executor.cpp",
     "if (pid && is_alive(*pid) && common::process_owner(pid->pid) == ::geteuid() && supervises(pid->pid, attempt)) {",
     "if (pid && is_alive(*pid) && common::process_owner(pid->pid) == ::geteuid()) {",
     ["test_lab.LabMode.test_a_pid_file_pointed_at_a_process_not_its_supervisor_is_never_taken_or_signalled"]),
    ("readopt-is-its-executable", "daemon/local_executor.cpp",
     "    return !ec && !m_shim_exe.empty() && exe == m_shim_exe;", "    return true;",
     ["test_lab.LabMode.test_a_pid_file_pointed_at_a_process_not_its_supervisor_is_never_taken_or_signalled"]),
    ("late-supervisor-starts-nothing", "supervisor/supervisor.cpp",
     "    if (!*w) {\n      complain(\"the attempt was withdrawn", "    if (false) {\n      complain(\"the attempt was withdrawn",
     ["unit:a supervisor late for its attempt*"]),
    ("adopt-withdraws", "daemon/local_executor.cpp",
     "    if (!pid && !common::path_exists(pid_file)) {\n", "    if (false) {\n",
     ["unit:a supervisor late for its attempt*"]),
    ("withdrawn-number-kept", "daemon/lifecycle.cpp",
     "            if (n.number_taken)\n              next.attempt_base = rec.attempt_base + 1;  // not one of its tries\n",
     "            if (false)\n              next.attempt_base = rec.attempt_base + 1;  // not one of its tries\n",
     ["unit:a launch recorded but never started*",
      "test_lifecycle.Durability.test_a_job_marked_running_that_never_started_runs_again_after_a_crash"]),
    ("claim-once", "common/process.cpp",
     "  int linked = ::link(tmp.c_str(), path.c_str());", "  int linked = ::rename(tmp.c_str(), path.c_str());",
     ["unit:a supervisor late for its attempt*", "unit:create_file_once*"]),
    ("budget-stops-only-when-short", "daemon/gpu_budgets.cpp",
     "      if (free < owed && j->may_stop) {", "      if (j->may_stop) {",
     ["unit:over its budget on a GPU with room*", "test_gpu_memory.Budgets.test_a_job_over_its_budget_with_room_beside_it_has_it_raised_and_runs_on"]),
    ("budget-stops", "daemon/gpu_budgets.cpp",
     "      if (free < owed && j->may_stop) {", "      if (false) {",
     ["test_gpu_memory.Budgets.test_a_job_over_its_budget_beside_one_owed_the_room_is_requeued_with_more_and_its_neighbour_runs_on"]),
    ("budget-policy-warn", "daemon/config.hpp",
     "    return spec.gpu_memory_policy == common::MemoryPolicy::requeue;", "    return true;",
     ["test_gpu_memory.Budgets.test_policy_warn_raises_the_budget_of_a_job_beside_one_owed_the_room_and_stops_nothing"]),
    ("budget-lab-policy", "daemon/config.hpp",
     " || (multi_user && gpu_memory_policy == \"requeue\"))", ")",
     ["unit:the policy: the spec's*"]),
    ("budget-frozen-owed-nothing", "daemon/gpu_budgets.cpp",
     "      } else if (j->judged && j->budget_mb > j->used_mb) {", "      } else if (j->budget_mb > j->used_mb) {",
     ["unit:a frozen job keeps what it holds*"]),
    ("budget-leaving-comes-back", "daemon/gpu_budgets.cpp",
     "      if (!j->leaving) {", "      if (true) {",
     ["unit:a job stopping is not judged*"]),
    ("budget-raise-within-room", "daemon/gpu_budgets.cpp",
     "        o.raised_mb = std::max(std::min(larger, room), j->used_mb);", "        o.raised_mb = larger;",
     ["unit:over its budget on a GPU with room*"]),
    ("budget-packed-by", "daemon/pass_inputs.cpp",
     "      h.allocated_mb += a.rec.spec.shared ? gpu_budget_mb(a.rec) : total->second;",
     "      h.allocated_mb += a.rec.spec.shared ? a.rec.spec.gpu_memory_mb : total->second;",
     ["test_gpu_memory.Budgets.test_a_job_over_its_budget_with_room_beside_it_has_it_raised_and_runs_on"]),
    ("budget-oom-raised", "daemon/attempts.cpp",
     "    if (raised > budget) {", "    if (false) {",
     ["test_gpu_memory.Budgets.test_cuda_out_of_memory_at_its_budget_runs_it_again_with_more_no_retry_spent_up_to_the_whole_gpu"]),
    ("budget-oom-crowded-out", "daemon/attempts.cpp",
     "      !crowded_out) {", "      true) {",
     ["test_placement.NvmlGpus.test_a_job_out_of_gpu_memory_names_its_peak_the_outsider_that_grew_and_the_xid"]),
    ("gpu-peak-kept", "daemon/attempts.cpp",
     "    ending.gpu_budget.peak_mb = std::max(ending.gpu_budget.peak_mb, *peak);", "    (void)*peak;",
     ["test_gpu_memory.Budgets.test_a_job_over_its_budget_with_room_beside_it_has_it_raised_and_runs_on"]),
    ("budget-given-to-job", "daemon/launcher.cpp",
     "  if (gpu_budget_mb(job) > 0) env[\"GPUQ_GPU_MEMORY_MB\"] = std::to_string(gpu_budget_mb(job));",
     "  if (job.spec.gpu_memory_mb > 0) env[\"GPUQ_GPU_MEMORY_MB\"] = std::to_string(job.spec.gpu_memory_mb);",
     ["test_gpu_memory.Budgets.test_a_job_over_its_budget_beside_one_owed_the_room_is_requeued_with_more_and_its_neighbour_runs_on"]),
    ("launch-doc-symlink", "common/process.cpp",
     "  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;",
     "  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;",
     ["unit:write_file_atomic*"]),
    ("clean-follows-links", "common/paths.cpp",  # both guards: each alone covers for the other
     [("  if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {",
       "  if (::fstatat(parent, name.c_str(), &st, 0) != 0) {"),
      ("O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);\n    if (fd >= 0) {",
       "O_RDONLY | O_DIRECTORY | O_CLOEXEC);\n    if (fd >= 0) {")], None,
     ["unit:remove_tree deletes a symlink*"]),
    ("fds-inherited", None,  # both layers: gpuqd's, before it execs a supervisor (or its server), and the supervisor's
     [("daemon/launcher.cpp", "    ::setsid();\n    mark_inherited_fds_cloexec();\n", "    ::setsid();\n"),
      ("supervisor/supervisor.cpp", "    mark_inherited_fds_cloexec();\n", "\n")], None,
     ["test_reliability.InheritedDescriptors"]),
    ("user-max-gpus", "daemon/scheduler.cpp",
     "|| (cap.max_gpus > 0 && cap.gpus + gpus > cap.max_gpus);", ";",
     ["test_lab.LabSharing.test_max_gpus_holds_a_users_gpus_and_the_free_one_goes_to_another"]),
    ("usage-half-life", "daemon/users.cpp",
     "  return it->second.gpu_s * std::exp2(-std::max(0.0, now - it->second.at) / m_rules.usage_half_life_s);",
     "  return it->second.gpu_s;",
     ["test_lab.LabSharing.test_gpu_use_is_forgotten_at_the_half_life"]),
    ("launch-doc-owner", "supervisor/supervisor.cpp",
     "  if (::geteuid() == 0 && (st.st_uid != 0 || st.st_nlink != 1)) {", "  if (false) {",
     ["test_hostile.LaunchDocument"]),
    ("sigterm-first", "supervisor/supervisor.cpp",
     "signal_all(m_killing ? SIGKILL : m_first_signal);", "signal_all(SIGKILL);",
     ["test_reliability.Cancel.test_cancel_sends_sigterm_first_and_waits_the_grace_for_the_job_to_clean_up"]),
    ("grace-waited", "supervisor/supervisor.cpp",
     "if (!m_killing && mono_now() >= m_kill_at) m_killing = true;", "if (!m_killing) m_killing = true;",
     ["test_reliability.Cancel.test_cancel_sends_sigterm_first_and_waits_the_grace_for_the_job_to_clean_up"]),
    ("gang-teardown", "supervisor/supervisor.cpp",
     "    if (!m_tearing_down) begin_teardown();\n  }", "  }",
     ["test_ddp.Gang.test_one_failing_rank_tears_down_the_gang_and_is_named"]),
    ("idle-timeout", "daemon/server.cpp",
     "if (!ec) self->m_socket.close();  // silent client: let it go", "(void)ec;",
     ["test_errors.ProtocolAbuse.test_a_silent_client_does_not_block_others_and_is_dropped_after_the_idle_timeout"]),
    ("event-line-bound", "daemon/events.cpp",
     "  if (line.size() > k_max_event_line) return \"over \" + std::to_string(k_max_event_line >> 20) + \" MiB\";\n", "\n",
     ["unit:a whole line over the limit*"]),
    ("reply-jobs-bound", "daemon/reads.cpp",
     "if (out.jobs.size() >= static_cast<std::size_t>(common::k_max_reply_jobs) || bytes >= common::k_max_reply_bytes) {",
     "if (bytes >= common::k_max_reply_bytes) {",
     ["test_hostile.BoundedReplies"]),
    ("events-per-read", "daemon/event_tick.cpp",
     "const std::int64_t budget = ended ? std::numeric_limits<std::int64_t>::max() : k_events_per_call;",
     "const std::int64_t budget = std::numeric_limits<std::int64_t>::max();",
     ["test_queue.ResultsWaitLogs.test_a_flooded_events_file_is_read_at_most_8_mib_at_a_time_while_the_job_runs"]),
    ("slurm-gang-cancel-signal", "daemon/slurm_executor.cpp",
     'argv.push_back("--signal=URG");\n    }\n    argv.push_back(slurm_id);\n    run_off_thread(std::move(argv), [this, slurm_id](CommandResult r) {\n      if (!r.started || r.exit_code != 0) scancel(slurm_id);  // pending',
     'argv.push_back("--signal=TERM");\n    }\n    argv.push_back(slurm_id);\n    run_off_thread(std::move(argv), [this, slurm_id](CommandResult r) {\n      if (!r.started || r.exit_code != 0) scancel(slurm_id);  // pending',
     ["test_slurm.SlurmExecutor.test_a_gang_over_two_nodes_times_out_on_both_and_another_is_cancelled"]),
    ("slurm-task-timeout-exit", "supervisor/supervisor.cpp",
     "return written != 0 ? written : task.rank_failed() ? 1 : 0;",
     "return written != 0 ? written : task.succeeded() ? 0 : 1;",
     ["test_slurm.SlurmExecutor.test_a_gang_over_two_nodes_times_out_on_both_and_another_is_cancelled"]),
    ("slurm-gang-outcome", "daemon/slurm_executor.cpp",
     's << "exec " << shim << " --slurm-outcome\\n";', 's << "exit $?\\n";',
     ["test_slurm.SlurmExecutor.test_a_gang_over_two_nodes_times_out_on_both_and_another_is_cancelled"]),
    ("slurm-commands-nofile", "daemon/launcher.cpp",
     "  common::set_children_descriptor_limit(before);", "",
     ["test_slurm.SlurmExecutor.test_jobs_get_the_descriptor_limit_gpuqd_started_with_not_the_one_it_raised"]),
    ("events-at-end", "daemon/event_tick.cpp",
     "const std::int64_t budget = ended ? std::numeric_limits<std::int64_t>::max() : k_events_per_call;",
     "const std::int64_t budget = ended ? limit : k_events_per_call;",
     ["test_queue.ResultsWaitLogs.test_a_job_that_ends_with_more_than_a_read_of_events_unread_loses_none_of_them"]),
    ("slurm-task-stop-file", "supervisor/supervisor.cpp",
     "if (!m_stop_file.empty() && common::path_exists(m_stop_file)) {", "if (false) {",
     ["test_slurm.SlurmTask.test_a_stop_sent_before_the_supervisor_caught_signals_is_found_in_the_attempt_directory"]),
    ("fds-short", "daemon/attempts.cpp",
     "  if (m_free < 0) return std::nullopt;  // unknown: no /proc\n", "  return std::nullopt;\n",
     ["test_hostile.OutOfDescriptors.test_jobs_wait_for_descriptors_instead_of_failing",
      "unit:the descriptor budget*"]),
    ("fds-spend", "daemon/attempts.cpp",
     "    m_free -= k_descriptors_per_launch;\n", "\n",
     ["unit:the descriptor budget*"]),
    ("fds-pass-begin", "daemon/attempts.cpp",
     "  m_launching = launching;\n  m_held_back = false;\n",
     "  if (launching) m_launching = true, m_held_back = false;\n",
     ["unit:gpuqd's log says once that launches wait*"]),
    ("retry-budget", "daemon/lifecycle.cpp",  # the one rule, asked by an attempt's end and held by Retried
     "  return run >= 1 && run <= rec.spec.retries && rec.spec_error.empty();",
     "  return run >= 1 && run < rec.spec.retries && rec.spec_error.empty();",
     ["unit:a failed attempt is retried after a backoff*"]),
    ("dependency-chain", "daemon/dependencies.cpp",
     "if (blocked_by.emplace(w->second, doomed[i]).second) doomed.push_back(w->second);",
     "blocked_by.emplace(w->second, doomed[i]);",
     ["unit:a failed dependency fails its whole chain*"]),
    ("dependency-part", "daemon/dependencies.cpp",
     "  if (left) doomed.resize(k_doomed_part);\n", "\n",
     ["unit:a long failed chain fails a part at a time*"]),
    ("withdraw-cancelling", "daemon/dependencies.cpp",
     "    if (a.rec.run.cancel_requested) continue;\n", "\n",
     ["unit:jobs handed over after a dependency*"]),
    ("client-reply-bound", "common/client.cpp",
     "    if (m_buffer.size() > k_max_reply_line)\n", "    if (false)\n",
     ["test_hostile.HostileDaemon.test_a_reply_line_without_end_is_read_to_a_bound_and_refused"]),
    ("client-reply-timeout", "common/client.cpp",
     "    if (timeout_s > 0) {\n      const auto left", "    if (false) {\n      const auto left",
     ["test_hostile.HostileDaemon.test_a_daemon_that_never_answers_times_out_with_exit_3"]),
    ("restart-max-queued", "daemon/restart.cpp",
     "  m_users.check_restart(r.chosen, [this](uid_t u) { return queued_or_running(m_jobs, m_pins, u); });  // max_queued, as at submit\n",
     "\n",
     ["test_lab.LabSharing.test_max_queued_holds_on_every_path_that_queues_jobs"]),
    ("plot-xml-chars", "cli/plot.cpp",
     "(cp >= 0xE000 && cp <= 0xFFFD)", "(cp >= 0xE000 && cp <= 0xFFFF)",
     ["unit:svg: names XML forbids*"]),
    ("idx-header-memory", "worker/data.cpp",
     "    const std::uint64_t want = std::min(count - got, k_step);",
     "    const std::uint64_t want = count - got;",
     ["unit:an IDX header's word*"]),
    ("lab-settings-outside-lab", "daemon/main.cpp",
     '!config.has("user_limits") &&\n        !config.has("usage_half_life_s") && !config.has("max_priority"))',
     "true)",
     ["test_config.Config.test_gpuqd_options_check_as_the_file_does_and_lab_settings_need_lab_mode"]),
    ("option-duration-check", "common/config.cpp",
     "    if (!d) return Error{ErrorCode::bad_request,", "    if (!d) d = 0.0;\n    if (false) return Error{ErrorCode::bad_request,",
     ["unit:gpuqd's options are the table's*"]),
    # A job whose stored spec does not parse (a later gpuq's, or damaged) has no command: it must
    # never launch, and nothing may write a default spec over the one not read.
    ("unreadable-spec-read", "daemon/store_read.cpp",
     "  j.spec_error = std::move(why);\n", "\n",
     ["unit:a stored spec that does not parse*"]),
    ("unreadable-spec-recovery", "daemon/daemon.cpp",
     "      if (a.rec.state == JobState::queued) {", "      if (false) {",
     ["unit:a job whose stored spec does not parse never runs*"]),
    ("unreadable-spec-launch", "daemon/lifecycle.cpp",
     "            if (!rec.spec_error.empty()) return unreadable(rec, e);\n            clear_attempt(next);\n            next.state = JobState::running;",
     "            clear_attempt(next);\n            next.state = JobState::running;",
     ["unit:a job whose stored spec does not parse is never launched*"]),
    ("unreadable-spec-back-in-line", "daemon/lifecycle.cpp",
     "  if (rec.spec_error.empty()) return event::NeverStarted{std::move(reason), number_taken};",
     "  return event::NeverStarted{std::move(reason), number_taken};",
     ["unit:a job whose stored spec does not parse*"]),
    ("unreadable-spec-resumed-restart", "daemon/restart.cpp",
     "    if (!rec->spec_error.empty()) {  // only in a restart resumed at start", "    if (false) {  // only in a restart resumed at start",
     ["unit:a restart resumed at start leaves a job whose stored spec*"]),
    ("unreadable-spec-update", "daemon/control.cpp",
     "    if (!rec.spec_error.empty())  // rewriting it", "    if (false)  // rewriting it",
     ["unit:a job whose stored spec does not parse never runs*"]),
    # The protocol's field tables: a bound the schema states that the decoder does not hold.
    ("request-string-bound", "common/field_table.hpp",
     " || static_cast<double>(characters(text)) > b.max) bad(name, want);",
     " || static_cast<double>(characters(text)) > 2 * b.max) bad(name, want);",
     ["unit:the schema says of each command's request*"]),
    ("submit-cwd-absolute", "common/protocol.cpp",
     "if (path.rfind('/', 0) != 0 || path.size() > k_max_path ||",
     "if (path.size() > k_max_path ||",
     ["test_protocol.ProtocolSchema.test_what_the_schema_refuses_gpuqd_refuses_by_name"]),
    ("request-integer-edge", "common/field_table.hpp",
     "if (!x || static_cast<double>(*x) < b.min || static_cast<double>(*x) > b.max) bad(name, want);",
     "if (!x || static_cast<double>(*x) < b.min || static_cast<double>(*x) > b.max + 1) bad(name, want);",
     ["unit:the schema says of each command's request*"]),
    ("submit-cwd-nul", "common/protocol.cpp",
     " || path.find('\\0') != std::string::npos)", ")",
     ["unit:the schema says of each command's request*", "unit:request decoders name the offending field"]),
    # A reply given later: sent once, and a wait whose answer fails is still answered.
    ("later-sent-once", "daemon/reply.hpp",
     "    if (auto to = std::exchange(m_send, nullptr)) to(std::move(j));", "    if (m_send) m_send(std::move(j));",
     ["unit:a Later sends one reply*"]),
    ("wait-answer-fails", "daemon/waiters.cpp",
     "  try {\n    done.reply(m_answer(done.caller, done.ids, timed_out));\n  } catch",
     "  done.reply(m_answer(done.caller, done.ids, timed_out));\n  if (false) try {\n  } catch",
     ["unit:a wait whose answer cannot be made*"]),
    # Watches: another user's progress is not news; a held watch's cursor follows what it skipped;
    # a cursor older than the journal is reset; the journal is bounded; a cut reply misses nothing.
    ("watch-details-visibility", "daemon/watches.hpp",
     "    return c.kind == Kind::state || may_read_details(caller, c.uid);", "    return true;",
     ["test_lab.LabMode.test_a_watch_shows_another_user_s_job_changing_but_never_its_progress",
      "unit:another user's progress is not news*"]),
    ("watch-held-start-at-its-change", "daemon/watches.cpp",
     "    h.q.after = m_head - 1;\n", "\n",
     ["unit:a watch hears only its ids and batch*"]),
    ("watch-old-cursor-reset", "daemon/watches.cpp",
     " || (q.after < first - 1 && dropped_for(caller) > q.after)) {", ") {",
     ["unit:a cursor of another run*"]),
    ("watch-invisible-drops-reset", "daemon/watches.cpp",
     " || (q.after < first - 1 && dropped_for(caller) > q.after)) {", " || q.after < first - 1) {",
     ["unit:a caller's cursor moves only over changes it may see*"]),
    ("watch-journal-bounded", "daemon/watches.cpp",
     "  if (m_journal.size() > m_capacity) {\n", "  if (false) {\n",
     ["unit:a cursor of another run*"]),
    ("watch-cut-cursor", "daemon/watches.cpp",
     "    out.cursor = before[took];", "    out.cursor = m_head;",
     ["unit:a reply cut at its page*"]),
    ("watch-answer-fails", "daemon/watches.cpp",
     "  } catch (const std::exception& e) {\n    h.reply.fail(error_of(e));",
     "  } catch (const std::bad_alloc& e) {\n    h.reply.fail(error_of(e));",
     ["unit:a watch whose answer cannot be made*"]),
    ("held-request-hangup", "daemon/server.cpp",
     "      if (self->m_held) self->notice_hangup();\n", "\n",
     ["test_errors.ProtocolAbuse.test_clients_that_hang_up_on_a_held_wait_or_watch_are_let_go_at_once"]),
    ("watch-cursor-visible-only", "daemon/watches.cpp",
     "    if (visible(caller, c) && ids.size() <= page) cursor = seq;", "    if (ids.size() <= page) cursor = seq;",
     ["unit:a caller's cursor moves only over changes it may see*"]),
    # Unread replies are bounded per user: connections that do not read are let go.
    ("outbox-per-user-bound", "daemon/outbox.cpp",
     "  while (unsent_of(uid) + bytes > m_per_user) {", "  while (false) {",
     ["test_budgets.UnreadReplies.test_replies_nobody_reads_are_bounded_and_their_connections_let_go",
      "unit:a user's unread replies stay under its bound*"]),
    ("outbox-counts-what-is-sent", "daemon/server.cpp",
     "      self->m_outbox->sent(self->m_key, text->size());\n", "\n",
     ["unit:a user's unread replies stay under its bound*",
      "test_budgets.UnreadReplies.test_replies_nobody_reads_are_bounded_and_their_connections_let_go"]),
    ("outbox-counts-unfinished-lines", "daemon/server.cpp",
     "    if (!m_outbox->add(m_key, got)) return;  // dropped to make room for its user\n", "\n",
     ["test_budgets.UnfinishedRequests.test_lines_not_yet_ended_count_with_unread_replies_against_the_same_bound"]),
    # A connection reads nothing more once closed (nor keeps what came after a held request), the
    # idle limit runs while a line too long is skipped, and a connection waiting for a request
    # holds no buffer.
    ("read-stops-once-closed", "daemon/server.cpp",
     "    if (!m_socket.is_open()) return;  // gone while its last request was answered: read no more of it\n", "\n",
     ["test_budgets.DroppedWhileHeld.test_a_connection_dropped_with_lines_behind_its_held_wait_reads_none_of_them"]),
    ("idle-runs-through-a-skipped-line", "daemon/server.cpp",
     "      take(m_in.size());\n      return discard_line();", "      m_idle.cancel();\n      take(m_in.size());\n      return discard_line();",
     ["test_errors.ProtocolAbuse.test_a_line_too_long_left_unended_is_still_closed_at_the_idle_limit"]),
    ("no-read-buffer-while-idle", "daemon/server.cpp",
     "    m_in.append(chunk.data(), got);",
     "    m_in.resize(have + 65536), m_in.resize(have), m_in.append(chunk.data(), got);",
     ["test_errors.ProtocolAbuse.test_idle_connections_hold_no_read_buffer"]),
    ("held-request-let-go-on-hang-up", "daemon/server.cpp",
     "    m_daemon.abandon(m_caller.connection);\n", "\n",
     ["test_errors.ProtocolAbuse.test_clients_that_hang_up_on_a_held_wait_or_watch_are_let_go_at_once"]),
    ("reads-skip-others-details", "daemon/store_read.cpp",
     "    const bool detailed = !details || details(j.uid);", "    const bool detailed = true;",
     ["unit:a read parses the details only of the jobs whose owners it is told*"]),
    # A user's connections are bounded; an admin's are not.
    ("connections-per-user", "daemon/server.cpp",
     "    if (m_outbox->connections_of(uid) > m_limits.per_user)\n", "    if (false)\n",
     ["test_lab.LabSharing.test_one_users_connections_are_bounded_and_the_others_still_get_in"]),
    ("connections-admins-unbounded", "daemon/server.cpp",
     "    if (auto over = admin ? std::nullopt : over_limits(cred.uid)) {",
     "    if (auto over = over_limits(cred.uid)) {",
     ["test_lab.LabSharing.test_one_users_connections_are_bounded_and_the_others_still_get_in"]),
    ("refusal-lingers", "daemon/server.cpp",
     "        self->linger();\n", "        self->m_socket.close();\n",
     ["test_lab.LabSharing.test_one_users_connections_are_bounded_and_the_others_still_get_in"]),
    # Users take turns on gpuqd's thread; idle means idle; the metrics listener keeps room for scrapes.
    ("turns-rotation", "daemon/turns.cpp",
     "    m_rotation.push_back(uid);  // to the back", "    m_rotation.push_front(uid);  // to the back",
     ["unit:each user with requests waiting is served one in turn*",
      "test_lab.LabSharing.test_users_take_turns_on_gpuqds_thread"]),
    ("turns-bypassed", "daemon/turns.cpp",
     "  auto& queue = m_queues[uid];\n", "  if (true) return request();\n  auto& queue = m_queues[uid];\n",
     ["test_lab.LabSharing.test_users_take_turns_on_gpuqds_thread"]),
    ("idle-counts-from-last-request", "daemon/server.cpp",
     "    m_idle.expires_at(m_active_at + std::chrono::milliseconds(static_cast<long long>(m_idle_s * 1000)));",
     "    m_idle.expires_after(std::chrono::milliseconds(static_cast<long long>(m_idle_s * 1000)));",
     ["test_errors.ProtocolAbuse.test_lines_that_are_not_requests_do_not_keep_a_connection_open"]),
    ("metrics-oldest-goes", "daemon/metrics_http.cpp",
     "      while (state->open >= k_max_connections && !state->by_age.empty()) {",
     "      if (state->open >= k_max_connections) return socket.close(), accept();\n      while (false) {",
     ["test_metrics.Metrics.test_held_connections_keep_no_scrape_out_the_oldest_is_closed_for_a_new_one"]),
    # A pidfd's wait that Asio completes for a closed descriptor's readiness is not taken for the
    # process's end (the daemon-death test killed a live attempt so).
    ("wait-taken-for-readiness", "daemon/readiness.hpp",
     "                 if (!ec && !readable_now(d.native_handle())) return when_readable(d, std::move(done));\n",
     "\n",
     ["unit:a wait on a descriptor registered where a closed one's readiness is still queued*"]),
    # A report pattern looks at the first 4 KiB of a line only: the work a job's output costs its
    # root supervisor is bounded per line.
    ("report-line-bound", "supervisor/output_report.cpp",
     "      const std::size_t take = std::min(room, static_cast<std::size_t>(stop - data));\n",
     "      const std::size_t take = static_cast<std::size_t>(stop - data) + 0 * room;\n",
     ["unit:a carriage return ends a line and only the start of a long line is looked at"]),
    # The supervisor's last read of a rank's output stops after 2 s: a writer outside the job that
    # holds the pipe cannot keep the attempt (and its GPUs) from ending.
    ("final-drain-bound", "supervisor/supervisor.cpp",
     "        if (drain && mono_now() >= drain_until) {\n",
     "        if (drain && mono_now() >= drain_until + 1e9) {\n",
     ["test_report.Report.test_a_writer_outside_the_job_holding_its_output_cannot_keep_the_attempt_from_ending"]),
    # What a bad event line shows of itself is its first bytes: the line is the job's, any length.
    ("bad-line-excerpt-bound", "daemon/events.cpp",
     "  const std::string excerpt(line.substr(0, k_bad_line_excerpt));\n",
     "  const std::string excerpt(line);\n",
     ["unit:what is said of a bad line is its first bytes*"]),
    # A client of protocol minor 2 or less reads labels as strings: typed ones would break its decode.
    ("labels-text-for-older-clients", "daemon/reads.cpp",
     "  if (viewer.protocol_minor < 3)  // it reads labels as strings: 0.3 as \"0.3\"\n",
     "  if (false)\n",
     ["test_protocol.ProtocolSchema.test_labels_keep_their_type_for_clients_that_read_it_and_are_text_for_older_ones"]),
    # One pass: the machine's checks run for the jobs whose specs read whole though others' did not.
    ("one-pass-validation", "daemon/submit_check.cpp",
     "  out.spec_problems = !out.problems.empty();\n",
     "  out.spec_problems = !out.problems.empty();\n  if (out.spec_problems) return out;\n",
     ["test_errors.SpecErrors.test_a_batch_with_problems_of_every_kind_names_them_all_in_one_answer"]),
    # `run --memory` takes digits and a unit, not what strtod takes (hex, a sign, an exponent).
    ("run-size-digits-only", "cli/commands/submit.cpp",
     "  if (used == 0 || !std::isdigit(static_cast<unsigned char>(text[0])) || used > 24) return std::nullopt;\n",
     "  try {\n    used = 0;\n    (void)std::stod(text, &used);\n  } catch (...) {\n    return std::nullopt;\n  }\n",
     ["test_run.Run.test_mistakes_are_named_and_submit_nothing"]),
    # The report's events go beside the rank's events file, never into it: a line the job writes
    # in pieces would take the supervisor's into its middle.
    ("report-events-beside", "supervisor/supervisor.cpp",
     "    m_events = report_path(events);\n", "    m_events = events;\n",
     ["test_report.Report.test_a_job_writing_its_own_events_in_pieces_loses_no_line_to_the_reports"]),
    ("report-offset-kept-across-restart", "daemon/daemon.cpp",
     "    if (!a.rec.spec.report.empty())\n      a.event_offsets", "    if (false)\n      a.event_offsets",
     ["test_report.Report.test_a_restarted_gpuqd_reads_on_from_where_it_was_in_the_reports_events"]),
    # gpuq requeue: the stopped attempt is not one of the job's tries; the request outlives gpuqd;
    # the attempt's end puts the job back in line rather than ending it.
    ("requeue-spends-no-retry", "daemon/lifecycle.cpp",
     "            next.attempt_base = rec.attempt_base + 1;  // the attempt it lost is not one of its tries",
     "            next.attempt_base = rec.attempt_base;",
     ["unit:a requeue stops a running job*",
      "test_control.Restart.test_a_requeued_job_checkpoints_on_sigterm_and_resumes_as_its_next_attempt_no_retry_spent"]),
    ("requeue-intent-stored", "daemon/store.cpp",
     "j.run.requeue_requested ? 2 : j.run.preempt_requested", "j.run.preempt_requested",
     ["unit:updates persist across reopening*",
      "test_control.Restart.test_a_requeue_asked_before_gpuqd_dies_is_carried_out_by_the_next"]),
    ("requeue-back-in-line", "daemon/attempts.cpp",
     "  if (rec.run.requeue_requested && !rec.run.cancel_requested && end.state != JobState::succeeded &&\n",
     "  if (false &&\n",
     ["test_control.Restart.test_a_requeued_job_checkpoints_on_sigterm_and_resumes_as_its_next_attempt_no_retry_spent"]),
    # Preemption (docs/preemption.md): only lower priorities, a victim once, protection against
    # livelock, the minimal set; the intent stored; the victim back in line, no retry spent, with
    # its checkpoint counted; its supervisor's file and signal.
    ("preempt-lower-priority-only", "daemon/preemption.cpp",
     "  if (r.priority >= j.priority) return Refusal::not_lower;\n", "",
     ["unit:only preemptible jobs of lower priority are victims",
      "unit:a victim of higher priority than the waiting job is never taken*",
      "test_preempt.Preemption.test_jobs_not_preemptible_or_not_lower_are_left_alone"]),
    ("preempt-once-in-lifecycle", "daemon/lifecycle.cpp",
     "            if (!running || stop_asked(rec)) return refused(rec, e, \"a running job not asked to stop yet\");",
     "            if (!running) return refused(rec, e, \"a running job not asked to stop yet\");",
     ["unit:every state and event*", "unit:a preemption stops a running job once*"]),
    ("preempt-protection", "daemon/preemption.cpp",
     "  if (r.preemptions >= rules.protect_after && now - std::max(r.started_at, r.resumed_at) < rules.min_run_s)",
     "  if (false)",
     ["unit:a job preempted often enough is protected*",
      "test_preempt.Protection.test_a_job_preempted_often_enough_runs_min_run_s_before_it_is_preempted_again"]),
    ("preempt-minimal-set", "daemon/preemption.cpp",
     "      if (!without.place(j, {}).empty()) chosen.erase(chosen.begin() + static_cast<std::ptrdiff_t>(k));",
     "",
     ["unit:victims taken and then found unneeded are put back*"]),
    ("preempt-checkpoint-counted", "daemon/events.cpp",
     "      job.run.checkpoint_at = std::max(job.run.checkpoint_at, e.at);", "",
     ["unit:a checkpoint event records when the job last saved its work*",
      "test_preempt.Preemption.test_an_urgent_job_preempts_a_low_gang_which_checkpoints_and_resumes_where_it_stopped"]),
    ("preempt-intent-stored", "daemon/store.cpp",
     "j.run.preempt_requested ? 3 : 0", "0",
     ["unit:updates persist across reopening*"]),
    ("preempt-back-in-line", "daemon/attempts.cpp",
     "  if (preempted.run.preempt_requested && !rec.run.cancel_requested && end.state != JobState::succeeded &&\n",
     "  if (false &&\n",
     ["test_preempt.Preemption.test_an_urgent_job_preempts_a_low_gang_which_checkpoints_and_resumes_where_it_stopped"]),
    ("preempt-not-over-an-own-end", "daemon/attempts.cpp",
     "      !outcome.timed_out && !failure.is_object() && rec.spec_error.empty()) {",
     "      rec.spec_error.empty()) {",
     ["unit:a preempted attempt goes back in line*"]),
    ("preempt-reserved-gpus-held", "daemon/preemption.cpp",
     "    if (place.empty()) {  // even all of them would not make room\n      hold_reserved();",
     "    if (place.empty()) {  // even all of them would not make room",
     ["unit:GPUs the pass reserved for a job earlier in line*"]),
    ("preempt-share-counts-coming", "daemon/preemption.cpp",
     "      if (rules.lab) rules.held[j.user] += j.gpus;\n      continue;", "      continue;",
     ["unit:lab fair share: a job waiting for GPUs coming free*"]),
    ("preempt-not-just-launched", "daemon/preemption.cpp",
     "  if (r.started_at >= now) return Refusal::just_launched;\n", "",
     ["unit:a job launched in this very pass is no victim*"]),
    ("requeue-not-while-preempting", "daemon/control.cpp",
     "    if (rec.run.preempt_requested)  // it goes back in line already, as preempted\n", "    if (false)\n",
     ["test_preempt.Preemption.test_a_preempted_job_shows_as_preempted_with_who_while_it_waits"]),
    ("preempt-spends-no-retry", "daemon/lifecycle.cpp",
     "            next.attempt_base = rec.attempt_base + 1;  // a preemption spends no retry",
     "            next.attempt_base = rec.attempt_base;",
     ["unit:a preemption stops a running job once*",
      "test_preempt.Preemption.test_a_job_that_ignores_its_signal_is_killed_after_its_grace_and_the_urgent_job_runs"]),
    ("preempt-reservation-holds", "daemon/pass_inputs.cpp",
     "  if (r.run.preempt_requested && r.run.preempted_at > 0)", "  if (false)",
     ["unit:one account of who holds which GPU*"]),
    ("preempt-file-written", "supervisor/supervisor.cpp",
     "      if (auto w = write_file_atomic(m_preempt_file, said.dump() + \"\\n\"); !w)",
     "      if (auto w = write_file_atomic(m_preempt_file + \".elsewhere\", said.dump()); !w)",
     ["test_preempt.Preemption.test_an_urgent_job_preempts_a_low_gang_which_checkpoints_and_resumes_where_it_stopped"]),
    ("first-signal-once-per-process", "supervisor/supervisor.cpp",
     "      if (!group && sig != SIGKILL && m_termed.count(-target) && ::getpgid(target) == target) return;\n", "",
     ["test_preempt.Preemption.test_each_process_gets_the_preempt_signal_once"]),
    ("preempt-spec-signal", "supervisor/supervisor.cpp",
     "      m_first_signal = m_preempt_signal;\n", "",
     ["test_preempt.Preemption.test_gpuq_preempt_sends_the_specs_signal_and_records_who"]),
    # The store's unused cache is given back before the heap is trimmed.
    ("heap-trim-releases-caches", "daemon/heap_trim.cpp",
     "  if (m_release) m_release();\n", "\n",
     ["unit:what a big batch left free is given back*"]),
    ("ended-states-not-kept-for-history", "daemon/job_table.cpp",
     "    if (!m_with_deps.empty())\n      m_ended[id] = a.rec.state;\n", "    if (true)\n      m_ended[id] = a.rec.state;\n",
     ["unit:an ended job leaves the table and every index*"]),
    ("heap-trim-once-idle", "daemon/heap_trim.cpp",
     "  const bool went_idle = idle && !m_was_idle;", "  const bool went_idle = false;",
     ["unit:once no job is queued or running*"]),
    # A submit's reply says where the watch stream stood before its jobs went live.
    ("submit-reply-cursor", "daemon/submissions.cpp",
     "  out.epoch = b->epoch, out.cursor = b->cursor;\n", "\n",
     ["test_watch.Watch.test_a_submit_says_where_the_stream_stood_before_its_jobs_so_a_watch_from_there_tells_of_them_at_once"]),
    ("submit-cursor-before-its-jobs", "daemon/submit.cpp",
     "s.cursor = m_watches.visible_head(s.caller);",
     "s.cursor = m_watches.visible_head(s.caller) + static_cast<std::int64_t>(s.staged.size());",
     ["test_watch.Watch.test_a_submit_says_where_the_stream_stood_before_its_jobs_so_a_watch_from_there_tells_of_them_at_once"]),
    ("request-cross-field-rule", "common/protocol.cpp",
     "  if (t.check) t.check(request);\n", "\n",
     ["unit:the schema says of each command's request*"]),
    # A cgroup per attempt: each rank joins it, the executor kills it when the supervisor is gone
    # and ends the attempt only once it is empty, and after a restart kills what a dead
    # supervisor left.
    ("rank-joins-cgroup", "supervisor/supervisor.cpp",
     'if (procs < 0 || ::write(procs, "0", 1) != 1) {  // "0": the writer', "if (false) {",
     ["test_supervision.AttemptCgroups.test_a_job_that_kills_its_supervisor_keeps_nothing_running_and_its_gpus_wait_for_that"]),
    ("cgroup-killed-when-supervisor-gone", "daemon/local_executor.cpp",
     "      m_cgroups->kill(s.cgroup);\n", "\n",
     ["test_supervision.AttemptCgroups.test_a_job_that_kills_its_supervisor_keeps_nothing_running_and_its_gpus_wait_for_that"]),
    ("shim-closes-cgroup-fd", "supervisor/supervisor.cpp",
     "    for (int fd : m_cgroups)\n      ::close(fd);\n    m_cgroups.clear();\n", "    m_cgroups.clear();\n",
     ["test_lab.LabMode.test_a_job_runs_in_its_attempts_cgroup_and_its_supervisor_lets_go_of_the_descriptor_that_put_it_there"]),
    # A supervisor out of its job's reach (lab mode): it stays root, acts on files as the owner,
    # and only the ranks take the owner's identity.
    ("ranks-take-owner", "supervisor/supervisor.cpp",
     "    if (owner && !owner->become()) {", "    if (false) {",
     ["test_lab.LabMode.test_jobs_run_as_their_owner_with_their_home_and_files"]),
    ("supervisor-files-as-owner", "supervisor/supervisor.cpp",
     "      (::setfsuid(o.uid), ::setfsuid(o.uid)) != static_cast<int>(o.uid)) {", "      false) {",
     ["test_lab.LabMode.test_jobs_run_as_their_owner_with_their_home_and_files"]),
    # A supervisor that has not ended its attempt past its timeout or a stop (SIGSTOPped by its
    # job in single-user mode) is killed by gpuqd, and the attempt recorded as timed out.
    ("overdue-supervisor-killed", "daemon/local_executor.cpp",
     "    signal_shim(s, SIGKILL);  // gone() follows", "    (void)s;  // gone() follows",
     ["test_supervision.AttemptCgroups.test_a_job_that_stops_its_supervisor_is_still_timed_out_and_cancelled_and_leaves_nothing"]),
    ("overdue-timeout-recorded", "daemon/local_executor.cpp",
     "    if (timeout) m_killed_at_timeout.insert(id);\n", "\n",
     ["test_supervision.AttemptCgroups.test_a_job_that_stops_its_supervisor_is_still_timed_out_and_cancelled_and_leaves_nothing"]),
    # An attempt whose processes SIGKILL does not end (stuck in the kernel) ends past a bound with
    # its GPUs drained, back in service once they are gone, an admin's drain meanwhile kept.
    ("lingering-drains-gpus", "daemon/attempts.cpp",
     "        m_machine.health.set_drained({{gpu}, {}, h.reason}, true);\n", "\n",
     ["unit:an attempt whose processes live on drains its GPUs*"]),
    ("lingering-leaves-others-drain", "daemon/attempts.cpp",
     "      if (m_machine.health.drained(g->uuid)) {", "      if (false) {",
     ["unit:an attempt whose processes live on drains its GPUs*"]),
    ("lingering-shared-gpu", "daemon/attempts.cpp",
     "if (h.jobs.size() == 1 && h.jobs.count(id))", "if (h.jobs.count(id))",
     ["unit:an attempt whose processes live on drains its GPUs*"]),
    ("release-only-its-own-drain", "daemon/gpu_service.cpp",
     "g && m_drained.count(g->uuid) && m_drained.at(g->uuid) == reason) {", "g && m_drained.count(g->uuid)) {",
     ["unit:an attempt whose processes live on drains its GPUs*"]),
    ("lingering-is-the-attempts", "daemon/local_executor.cpp",
     "if (!m_cgroups || !m_lingering.count(m_cgroups->path(cgroup_name(attempt)))) return {};",
     "if (!m_cgroups || m_lingering.empty() || attempt.id < 0) return {};",
     ["unit:an attempt whose processes will not die ends after the bound*"]),
    ("lingering-released", "daemon/local_executor.cpp",
     "      if (m_released && !job_lingers) m_released(id);\n", "      (void)job_lingers;\n",
     ["unit:an attempt whose processes will not die ends after the bound*"]),
    # At start, what an ended attempt left behind is watched again, its GPUs held, and GPUs of
    # jobs whose processes are gone meanwhile put back in service.
    ("resume-holds-lingering", "daemon/attempts.cpp",
     "    if (left.count(job)) {", "    if (false) {",
     ["unit:GPUs drained for lingering processes are held at start*"]),
    ("resume-releases-gone", "daemon/attempts.cpp",
     "      m_machine.health.release({gpu}, reason);\n", "\n",
     ["unit:GPUs drained for lingering processes are held at start*"]),
    ("adopt-lingering", "daemon/local_executor.cpp",
     "      m_lingering[cgroup].id = id;\n      out.push_back(id);\n", "      (void)id;\n",
     ["unit:processes an ended attempt left behind are watched again*"]),
    ("hook-overdue-supervisor-killed", "daemon/hooks.cpp",
     "      ::syscall(SYS_pidfd_send_signal, watch->native_handle(), SIGKILL, nullptr, 0);\n", "\n",
     ["test_control.Hooks.test_a_hook_that_stops_its_supervisor_is_killed_past_its_limit"]),
    ("attempt-ends-when-cgroup-empty", "daemon/local_executor.cpp",
     "      if (!m_cgroups->empty(s.cgroup)) {", "      if (false) {",
     ["unit:an attempt has ended only once its supervisor is gone*"]),
    ("v1-kill-checks-membership", "daemon/cgroups.cpp",
     "    if (inside(pid)) ::syscall(SYS_pidfd_send_signal", "    if (!inside(pid)) ::syscall(SYS_pidfd_send_signal",
     ["unit:without cgroup.kill (v1)*"]),
    ("job-umask", "supervisor/supervisor.cpp",
     "  ::umask(027);  // the job's files", "  (void)0;  // the job's files",
     ["test_lab.LabMode.test_a_jobs_files_are_made_under_umask_027_whatever_gpuqds"]),
    ("adopt-empties-before-rerun", "daemon/local_executor.cpp",
     "!m_cgroups->empty(cgroup) && (pid || !emptied_soon(cgroup))) {", "!m_cgroups->empty(cgroup) && pid) {",
     ["test_supervision.AttemptCgroups.test_a_job_that_also_removes_its_supervisors_pid_file_is_killed_before_it_runs_again"]),
    ("adopt-kills-what-is-left", "daemon/local_executor.cpp",
     "if (!cgroup.empty() && !m_cgroups->empty(cgroup) && (pid || !emptied_soon(cgroup))) {",
     "if (!cgroup.empty() && !m_cgroups->empty(cgroup) && !pid && !emptied_soon(cgroup)) {",
     ["test_supervision.AttemptCgroups.test_processes_left_by_a_supervisor_killed_while_gpuqd_was_down_are_killed_when_it_is_back"]),
    ("zombie-is-not-alive", "common/process.cpp",
     ' || (*fields)[0] == "Z" || (*fields)[0] == "X") return false;', ' || (*fields)[0] == "X") return false;',
     ["unit:a process is identified by pid and start time*"]),
    # The executor places work where another system decides (Slurm): a retry goes alone, a job
    # follows a dependency Slurm knows, and its runtime counts from when Slurm started it.
    ("handover-retry-alone", "daemon/running.cpp",
     "    if (r.attempt != r.attempt_base) return std::nullopt;  // a retry\n", "\n",
     ["unit:a batch's first attempts go over as one array*"]),
    ("slurm-follows", "daemon/slurm_executor.cpp",
     "bool follows(std::int64_t dep) const override { return !external_id(dep).empty(); }",
     "bool follows(std::int64_t) const override { return false; }",
     ["test_slurm.SlurmExecutor.test_after_chains_wait_in_slurm_and_go_on_while_gpuqd_is_down"]),
    ("slurm-began-at", "daemon/slurm_executor.cpp",
     "s != out.end() && s->is_number()) o.began_at = s->get<double>();",
     "s != out.end() && s->is_number()) (void)s;",
     ["test_slurm.SlurmExecutor.test_after_chains_wait_in_slurm_and_go_on_while_gpuqd_is_down"]),
    ("limit-devices", "daemon/cgroups.cpp",
     "  if (in_force_at(Limit::devices, i)) {", "  if (false) {",
     ["test_supervision.KernelLimits.test_a_job_cannot_open_the_device_nodes_of_gpus_it_was_not_given",
      "unit:limits on a hybrid host*"]),
    ("limit-memory", "daemon/cgroups.cpp",
     "    if (memory && limits.memory_mb > 0) {", "    if (false) {",
     ["test_supervision.KernelLimits.test_a_rank_over_its_memory_is_killed_and_one_within_it_runs"]),
    ("limit-pids", "daemon/cgroups.cpp",
     "  if (in_force_at(Limit::pids, i) && limits.pids > 0)", "  if (false)",
     ["test_supervision.KernelLimits.test_a_fork_bomb_ends_at_the_attempts_process_limit"]),
    ("limit-cpuset", "daemon/cgroups.cpp",
     [("give_cpuset(dir, attempt_cores)", "give_cpuset(dir)"),
      ("if (auto given = give_cpuset(rank, cores); !given) return given;",
       "if (auto given = give_cpuset(rank); !given) return given;")], None,
     ["test_supervision.KernelLimits.test_a_rank_cannot_leave_its_cores"]),
    ("rank-joins-every-hierarchy", "supervisor/supervisor.cpp",
     "    for (std::size_t i = 0; i < cgroups.size(); ++i) {",
     "    for (std::size_t i = 0; i < std::min<std::size_t>(cgroups.size(), 1); ++i) {",
     ["test_supervision.KernelLimits.test_a_job_cannot_open_the_device_nodes_of_gpus_it_was_not_given"]),
    ("bpf-refuses-listed-devices", "daemon/cgroups.cpp",
     "insn(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0);  // refused", "insn(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 1);  // refused",
     ["unit:cgroup v2's device program*"]),
    ("devices-deny-probed", "daemon/cgroups.cpp",
     "limit == Limit::devices ? may_deny_devices(base)", "limit == Limit::devices && false ? may_deny_devices(base)",
     ["unit:the devices limit is in force only where*"]),
    ("freeze-before-kill", "daemon/cgroups.cpp",
     "  const bool freezes = !m_has_kill && can_freeze();", "  const bool freezes = false;",
     ["unit:without cgroup.kill*"]),
    ("freezer-thaws-after-kill", "daemon/cgroups.cpp",
     "  if (freezes) freeze(dir, false);\n",
     "", ["unit:without cgroup.kill*"]),
    ("oom-ends-out-of-memory", "daemon/attempts.cpp",
     "  } else if (outcome.oom_kills.value_or(0) > 0) {", "  } else if (false) {",
     ["unit:an attempt that failed after an OOM kill*",
      "test_reliability.OutOfMemory"]),
    ("oom-not-retried-unless-asked", "daemon/attempts.cpp",
     "    retryable = rec.spec.retry_on_oom && !outcome.final;", "    retryable = !outcome.final;",
     ["unit:an attempt that failed after an OOM kill*",
      "test_reliability.OutOfMemory"]),
    ("oom-count-read-before-removal", "daemon/local_executor.cpp",
     "      count_oom_kills(id, s.cgroup);\n      m_cgroups->remove(s.cgroup);", "      m_cgroups->remove(s.cgroup);",
     ["test_reliability.OutOfMemory"]),
    ("dev-listed-again-when-changed", "daemon/inventory.cpp",
     "      seen->mtime.tv_sec == d.st_mtim.tv_sec && seen->mtime.tv_nsec == d.st_mtim.tv_nsec)",
     "      true)",
     ["unit:the device nodes a job may not open*"]),
    ("device-program-by-its-nodes", "daemon/cgroups.cpp",
     "      auto known = programs.find(limits.denied_devices);", "      auto known = programs.begin();",
     ["test_supervision.KernelLimits.test_a_job_cannot_open_the_device_nodes_of_gpus_it_was_not_given"]),
    ("unpinned-cpuset-is-gpuqds-cores", "daemon/cgroups.cpp",
     "      auto shared = unpinned(i, common::format_cpu_list(limits.free_cores));",
     "      auto shared = unpinned(i, \"\");",
     ["test_supervision.KernelLimits.test_an_unpinned_rank_cannot_leave_the_cores_gpuqd_may_use"]),
    ("limits-held-per-rank", "daemon/cgroups.cpp",
     "        (in_force_at(Limit::memory, i) && limits.memory_mb > 0) || (in_force_at(Limit::cpuset, i) && pinned);",
     "        false;",
     ["unit:limits on a hybrid host*", "test_supervision.KernelLimits"]),
    ("dev-listing-kept-only-once-settled", "daemon/inventory.cpp",
     "  if (known && now.tv_sec - d.st_mtim.tv_sec >= 2)", "  if (known)",
     ["unit:the device nodes a job may not open*"]),
    ("v2-unpinned-held-to-free-cores", "daemon/cgroups.cpp",
     "  if (cpuset && used.v2 && !attempt_cores.empty())", "  if (cpuset && used.v2 && !per_rank && !attempt_cores.empty())",
     ["unit:limits on cgroup v2*"]),
    ("shared-cpuset-kept-while-running", "daemon/cgroups.cpp",
     '    if (none_running) ::rmdir((used.base + "/unpinned").c_str());', '    if (none_running || true) ::rmdir((used.base + "/unpinned").c_str());',
     ["unit:the cpuset unpinned attempts share*"]),
    ("cgroup-parent-used", "daemon/cgroups.cpp",
     "(h->v2 && !v2_parent.empty() ? v2_parent : h->own_dir())", "(h->own_dir())",
     ["unit:cgroup_parent*", "test_supervision.CgroupParent"]),
    ("cgroup-parent-owned", "daemon/cgroups.cpp",
     "  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0)", "  if (false)",
     ["test_supervision.CgroupParent"]),
    ("cgroup-base-moved", "daemon/cgroups.cpp",
     'if (keyed(before + "/cgroup.events", "populated").value_or(0) != 0)', "if (false)",
     ["unit:cgroup_parent*", "test_supervision.CgroupParent"]),
    ("cgroup-parent-checked", "daemon/cgroups.cpp",
     "  if (!on_cgroup2(path) || !common::path_exists(path + \"/cgroup.procs\"))",
     "  if (false)",
     ["unit:cgroup_parent*", "test_supervision.CgroupParent"]),
    ("no-cgroups-under-slurm", "daemon/main.cpp",
     '  if (s.config.executor != "slurm") {', "  if (true) {",
     ["test_slurm.SlurmExecutor.test_gpuqd_makes_no_cgroup_of_its_own_for_jobs_that_slurm_contains"]),
    ("jobs-cgroup-keeper-leaves", "packaging/gpuq-jobs-cgroup",
     'echo $$ >"$dir/keeper/cgroup.procs"\n', "\n",
     ["test_supervision.CgroupParent.test_the_packaged_jobs_cgroup_frees_its_units_cgroup_and_gpuqd_runs_attempts_below_it"]),
    ("forked-supervisor-named", "supervisor/serve.cpp",
     '    title.set({"gpuq-shim", r.launch.c_str()});\n', "\n",
     ["test_lifecycle.SupervisorServer.test_a_forked_supervisor_is_named_by_its_attempt_outlives_the_server_and_is_adopted_again"]),
    ("forked-supervisor-session", "supervisor/serve.cpp",
     "    ::setsid();\n    // Nothing blocked", "    // Nothing blocked",
     ["test_lifecycle.SupervisorServer.test_a_forked_supervisor_is_named_by_its_attempt_outlives_the_server_and_is_adopted_again"]),
    ("server-ends-with-gpuqd", "supervisor/serve.cpp",
     "    if (n <= 0) return 0;", "    if (n <= 0) return (void)::sleep(30), 0;",  # outlives gpuqd (a while)
     ["test_lifecycle.SupervisorServer.test_a_forked_supervisor_is_named_by_its_attempt_outlives_the_server_and_is_adopted_again"]),
    ("server-started-again", "daemon/launcher.cpp",
     "  for (int tries = 0; tries < 2; ++tries) {", "  for (int tries = 0; tries < 1; ++tries) {",
     ["unit:a supervisors' server that ends*",
      "test_lifecycle.SupervisorServer.test_a_server_that_dies_harms_no_running_job_and_the_next_start_gets_a_new_one"]),
    ("server-rests", "daemon/launcher.cpp",
     "  if (now < m_rest_until) return", "  if (false) return",
     ["unit:a supervisors' server that ends*"]),
    ("forked-supervisor-waits-to-go", "supervisor/serve.cpp",
     "    if (got != 1) ::_exit(3);", "    (void)got;",
     ["unit:a supervisor the server forks begins*"]),
    # Preemption under Slurm: the supervisor gets Slurm's preemption as SIGUSR1 (--signal=B:USR1),
    # a gang's tasks as SIGURG with `preempt` in the stop file; a job that ended within its
    # GraceTime (Slurm says FAILED or COMPLETED) is preempted all the same by Slurm's PreemptTime.
    ("slurm-preempt-signal", "common/slurm_script.cpp",
     '    out.push_back("--signal=B:USR1@30");\n', "",
     ["test_slurm.SlurmPreemption.test_a_job_slurm_preempts_gets_its_signal_and_file_and_resumes_as_a_new_attempt"]),
    ("slurm-gang-task-takes-preemption", "supervisor/supervisor.cpp",
     "      if (sig == SIGURG && m_stop_on_urg && !m_tearing_down && stop_is_preemption()) m_preempted = true;\n", "",
     ["test_slurm.SlurmPreemption.test_a_gang_slurm_preempts_has_every_rank_take_the_preemption"]),
    # A preemption stored but never sent (gpuqd died in between) is sent by the next gpuqd.
    ("preempt-resent-on-adoption", "daemon/daemon.cpp",
     "          m_executor->preempt(id, m_attempts.preempt_grace_s(a.rec.spec));", "          (void)0;",
     ["test_preempt.Recovery.test_a_preemption_stored_but_never_sent_is_sent_by_the_next_gpuqd"]),
    # on_preempt hooks: due with the record that preempts the job, told who preempted it.
    ("preempt-hook-due", "daemon/running.cpp",
     "    r.preempt_hook_due = m_jobs.contains(r.id) &&", "    r.preempt_hook_due = false && m_jobs.contains(r.id) &&",
     ["test_preempt.PreemptHooks.test_a_preempted_job_runs_its_on_preempt_hooks_once_a_preemption_and_its_on_finish_once"]),
    ("preempt-hook-by", "daemon/store.cpp",
     'bind_text(st, 3, std::string(event) == "preempt" ? jobs[i]->run.preempted_by : std::string());',
     "bind_text(st, 3, std::string());",
     ["unit:hooks due with a job's end are found until started*"]),
    ("hooks-migration-makes-missing-table", "daemon/store_open.cpp",
     '"BEGIN IMMEDIATE; CREATE TABLE IF NOT EXISTS hooks(job_id INTEGER PRIMARY KEY, started INTEGER NOT NULL "\n'
     '          "DEFAULT 0); INSERT', '"BEGIN IMMEDIATE; "\n          "INSERT',
     ["unit:a version 15 store's due on_finish hooks*"]),
    ("hook-queued-once", "daemon/hooks.hpp",
     "    if (m_waiting.insert(h).second) m_due.push_back(std::move(h));", "    m_due.push_back(std::move(h));",
     ["unit:a job's hooks due twice before their turn came*"]),
    ("hook-done-keeps-due-again", "daemon/store_side.cpp",
     'WHERE job_id = ? AND event = ? AND started != 0");', 'WHERE job_id = ? AND event = ?");',
     ["unit:hooks due with a job's end are found until started*"]),
    ("slurm-usr1-time-limit", "daemon/slurm_executor.cpp",
     "      if (took_usr1 && !preempted && !preempt_timed", "      if (false && took_usr1 && !preempted && !preempt_timed",
     ["test_slurm.SlurmPreemption.test_the_warning_of_a_time_limit_the_spec_did_not_set_ends_the_job_timed_out_not_preempted"]),
    ("slurm-preempt-time", "daemon/slurm_executor.cpp",
     '(preempt_timed && record.is_null() && (state == "COMPLETED" || state == "FAILED"));',
     '(preempt_timed && record.is_null() && state == "x");',
     ["test_slurm.SlurmPreemption.test_a_job_slurm_preempts_gets_its_signal_and_file_and_resumes_as_a_new_attempt",
      "test_slurm.SlurmPreemption.test_a_gang_slurm_preempts_has_every_rank_take_the_preemption"]),
    # Suspension (preemption's freeze in place).
    ("suspend-timeout-clock", "supervisor/supervisor.cpp",
     "if (attempt_frozen()) (m_tearing_down ? m_kill_at : deadline) += now - clock_at;",
     "if (attempt_frozen()) m_kill_at += now - clock_at;",
     ["test_preempt.Suspension.test_a_frozen_jobs_timeout_clock_stands_still"]),
    ("suspend-grace-clock", "supervisor/supervisor.cpp",
     "if (attempt_frozen()) (m_tearing_down ? m_kill_at : deadline) += now - clock_at;",
     "if (attempt_frozen()) deadline += now - clock_at;",
     ["test_preempt.Suspension.test_a_job_frozen_in_its_timeouts_grace_gets_the_whole_grace_after_its_thaw"]),
    ("suspend-thaw-before-stop", "daemon/local_executor.cpp",
     "    thaw(it->second);\n    signal_shim(it->second, SIGTERM);", "    signal_shim(it->second, SIGTERM);",
     ["test_preempt.Suspension.test_a_frozen_job_cancelled_is_thawed_first_and_handles_its_signal"]),
    ("suspend-kept-after-restart", "daemon/daemon.cpp",
     "          m_attempts.keep_suspended(id, wall_now());\n", "          (void)0;\n",
     ["test_preempt.Suspension.test_gpuqd_killed_mid_suspension_keeps_it_and_thaws_it_once_the_urgent_job_has_ended"]),
    ("suspend-victim-mode", "daemon/pass_inputs.cpp",
     "(r.spec.preempt_mode == common::PreemptMode::auto_ && r.spec.ranks <= 1));",
     "(r.spec.preempt_mode != common::PreemptMode::suspend));",
     ["test_preempt.Suspension.test_a_job_that_may_only_be_requeued_is_not_frozen_and_the_urgent_job_waits"]),
    ("suspend-auto-gangs", "daemon/pass_inputs.cpp",
     "(r.spec.preempt_mode == common::PreemptMode::auto_ && r.spec.ranks <= 1));",
     "(r.spec.preempt_mode == common::PreemptMode::auto_));",
     ["unit:who may be frozen*"]),
    ("suspend-hang-watch", "daemon/hang_watch.cpp",
     "                        r.run.suspended_for == 0 && now - std::max(at->get<double>(), r.run.resumed_at) > m_after_s;",
     "                        now - at->get<double>() > m_after_s;",
     ["unit:a job frozen for another is silent by design*"]),
    ("suspend-stopped-at-job", "daemon/scheduler.cpp",
     "        plan.wanting_slots.push_back(j);\n      break;", "      break;",
     ["unit:jobs without GPUs waiting for CPU slots are listed*"]),
    ("suspend-borrower-frozen", "daemon/preemption.cpp",
     "  if (freeze && r.borrows) return Refusal::borrows;\n", "",
     ["unit:a job running on what a frozen job lends is never frozen in turn",
      "test_preempt.Suspension.test_a_job_running_on_a_frozen_jobs_slot_is_not_frozen_in_turn"]),
    ("suspend-borrower-limits", "daemon/running.cpp",
     "      if (a.rec.state != JobState::queued || !within_limits(a.rec)) continue;",
     "      if (a.rec.state != JobState::queued) continue;",
     ["test_preempt.Suspension.test_a_borrower_keeps_to_its_batchs_limit"]),
    ("suspend-lab-idle-gpus", "daemon/preemption.cpp",
     "!r.gpus.empty() && j.gpus == 0) return Refusal::idles_others_gpus;",
     "!r.gpus.empty() && j.gpus == 0 && false) return Refusal::idles_others_gpus;",
     ["unit:lab mode: suspension keeps to a user's own jobs"]),
    ("suspend-kept-peak", "daemon/pass_inputs.cpp",
     "  return peak_mb ? std::max(*peak_mb, spec_mb) : 0;", "  return peak_mb ? spec_mb + 1000 : 0;",
     ["unit:what a frozen job keeps on its GPUs*",
      "test_preempt.NvmlSuspension.test_a_shared_job_that_does_not_fit_beside_it_is_not_started"]),
    ("suspend-freezable-only", "daemon/preemption.cpp",
     "  if (freeze && !r.may_suspend) return Refusal::not_freezable;", "  if (false) return Refusal::not_freezable;",
     ["unit:suspension takes only jobs that may be frozen*"]),
]


def run(cmd, **kw):
    return subprocess.run(cmd, **kw)


def sync_and_build():
    # The tree as git sees it (tracked, and new files not ignored), copied where it differs: files
    # that did not change keep their times, so the build stays incremental; those that did are
    # written now, so the build sees them newer than their objects.
    files = run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src, dst = os.path.join(REPO, rel), os.path.join(SRC, rel)
        if not os.path.isfile(src):
            continue
        with open(src, "rb") as f:
            content = f.read()
        if os.path.exists(dst):
            with open(dst, "rb") as f:
                if f.read() == content:
                    continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:  # written now: newer than any object built from the old text
            f.write(content)
        shutil.copymode(src, dst)
    if not os.path.exists(os.path.join(BUILD, "CMakeCache.txt")):
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        launcher = ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"] if shutil.which("ccache") else []
        run(["cmake", "-S", SRC, "-B", BUILD, *gen, *launcher, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
             "-DGPUQ_WITH_TORCH=OFF"], check=True, stdout=subprocess.DEVNULL)
    return build()


def build():
    r = run(["cmake", "--build", BUILD, "--parallel", str(os.cpu_count() or 2)], capture_output=True, text=True)
    return r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def check_tests(tests, bin_dir=None):
    """The tests a mutant names exist: a unit pattern that matches nothing passes, and an
    integration name that does not resolve fails, whatever the mutant does."""
    for t in tests:
        if t.startswith("unit:"):
            r = run([os.path.join(bin_dir or os.path.join(BUILD, "bin"), "gpuq_unit_tests"), f"-tc={t[5:]}", "-ltc"],
                    capture_output=True, text=True)
            if "passing the current filters: 0" in r.stdout or "passing the current filters" not in r.stdout:
                return f"no unit test case matches {t[5:]!r}"
    names = [t for t in tests if not t.startswith("unit:")]
    if names:
        r = run([sys.executable, "-c", "import sys, unittest\n"
                 "s = unittest.defaultTestLoader.loadTestsFromNames(sys.argv[1:])\n"
                 "def flat(t):\n"
                 "    return [x for c in t for x in flat(c)] if isinstance(t, unittest.TestSuite) else [t]\n"
                 "bad = [str(t) for t in flat(s) if 'FailedTest' in type(t).__name__]\n"
                 "sys.exit(1 if bad or s.countTestCases() == 0 else 0)", *names],
                cwd=os.path.join(REPO, "tests", "integration"), capture_output=True, text=True)
        if r.returncode != 0:
            return f"a test name does not resolve: {' '.join(names)}"
    return ""


def killed_by(tests):
    """True when some test fails against the mutant build."""
    env = dict(os.environ, GPUQ_BIN_DIR=os.path.join(BUILD, "bin"), PYTHONDONTWRITEBYTECODE="1")
    unit = [t[5:] for t in tests if t.startswith("unit:")]
    integration = [t for t in tests if not t.startswith("unit:")]
    # Output to a file, not a pipe: a process a mutant leaves behind (a job outliving its gpuqd)
    # would hold a pipe open, and the wait for its end with it.
    with open(os.path.join(WORK, "last-test.log"), "w") as out:
        for pattern in unit:
            r = run([os.path.join(BUILD, "bin", "gpuq_unit_tests"), f"-tc={pattern}"], stdout=out,
                    stderr=subprocess.STDOUT, timeout=600)
            if r.returncode != 0:
                return True
        if integration:
            try:
                # From the copy: a mutant of a script the tests run (packaging/) is the copy's.
                r = run([sys.executable, "-m", "unittest", *integration], cwd=os.path.join(SRC, "tests", "integration"),
                        env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900)
            except subprocess.TimeoutExpired:
                return True  # hung: the guard against hanging is gone, and the test noticed
            if r.returncode != 0:
                return True
    return False


def edits_of(path, snippet, replacement):
    """A mutant's edits as (path, old, new): one, several in one file, or several in several files."""
    if path is None:
        return snippet
    if replacement is None:
        return [(path, old, new) for old, new in snippet]
    return [(path, snippet, replacement)]


def check_table(bin_dir):
    """The table against the tree as it is: a snippet the code no longer holds (the code moved, and
    the mutant would be reported in error only when someone ran it) or a test renamed fails here."""
    problems = []
    names = [m[0] for m in MUTANTS]
    if len(set(names)) != len(names):
        problems.append("two mutants share a name")
    for name, path, snippet, replacement, tests in MUTANTS:
        for p, old, _ in edits_of(path, snippet, replacement):
            with open(os.path.join(REPO, p)) as f:
                count = f.read().count(old)
            if count != 1:
                problems.append(f"{name}: its snippet is in {p} {count} times, not once: {old!r}")
        if problem := check_tests(tests, bin_dir):
            problems.append(f"{name}: {problem}")
    for line in problems:
        print("mutants table: " + line)
    print(f"mutants table: {len(MUTANTS)} mutants, {len(problems)} problem(s)")
    return 1 if problems else 0


def main(words):
    if words[:1] == ["--check"] and len(words) == 2:
        return check_table(os.path.abspath(words[1]))
    chosen = [m for m in MUTANTS if not words or any(w in m[0] for w in words)]
    t0 = time.time()
    ok, log = sync_and_build()
    if not ok:
        print("mutants: the unmutated tree does not build:\n" + log)
        return 2
    print(f"mutants: baseline built in {WORK} ({time.time() - t0:.0f} s); {len(chosen)} mutant(s)")
    survived, broken = [], []
    for name, path, snippet, replacement, tests in chosen:
        t = time.time()
        if problem := check_tests(tests):
            broken.append(name)
            print(f"  {name:22} ERROR: {problem}")
            continue
        edits = edits_of(path, snippet, replacement)
        originals = {}
        for p in {p for p, _, _ in edits}:
            with open(os.path.join(SRC, p)) as f:
                originals[p] = f.read()
        missing = [(p, old) for p, old, _ in edits if originals[p].count(old) != 1]
        if missing:
            broken.append(name)
            print(f"  {name:22} ERROR: a snippet is not in {missing[0][0]} exactly once: {missing[0][1]!r}")
            continue
        mutated = dict(originals)
        for p, old, new in edits:
            mutated[p] = mutated[p].replace(old, new)
        for p, text in mutated.items():
            with open(os.path.join(SRC, p), "w") as f:
                f.write(text)
        try:
            built, log = build()
            if not built:
                broken.append(name)
                print(f"  {name:22} ERROR: the mutant does not build:\n{log}")
                continue
            verdict = killed_by(tests)
        finally:
            for p, text in originals.items():
                with open(os.path.join(SRC, p), "w") as f:
                    f.write(text)
                os.utime(os.path.join(SRC, p), None)  # newer than the mutant's object: rebuilt next time
        if not verdict:
            survived.append(name)
        print(f"  {name:22} {'killed' if verdict else 'SURVIVED'} ({time.time() - t:.0f} s) by {', '.join(tests)}")
    build()  # leave the copy built as the tree is
    print(f"mutants: {len(chosen) - len(survived) - len(broken)} killed, {len(survived)} survived"
          f"{': ' + ', '.join(survived) if survived else ''}, {len(broken)} in error ({time.time() - t0:.0f} s)")
    return 0 if not survived and not broken else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
