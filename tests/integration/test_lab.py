"""Lab mode (docs/lab.md): one gpuqd, run as root with --multi-user, for every user of the
machine. The test makes three ordinary users (two of them plain, one in an admin group), starts
gpuqd as root on fake GPUs and drives the real gpuq as each of them with runuser: jobs run as
their owner, other users' jobs cannot be touched, and a job cannot make the root daemon read or
write what its owner could not. Needs root (CI runs as root); skipped otherwise."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from harness import BIN, FAKE_NVML_DIR, Daemon, ensure_account, pids_matching, uid_of, wait_until

ALICE, BOB, CAROL = "gpuq-alice", "gpuq-bob", "gpuq-carol"
ADMINS = "gpuq-lab-admins"
ROOTS_SECRET = "root-only-5f1c9e"


@unittest.skipUnless(os.geteuid() == 0, "lab mode runs gpuqd as root")
class LabMode(unittest.TestCase):
    CONFIG = None  # gpuqd's configuration file, as a dict
    @classmethod
    def setUpClass(cls):
        subprocess.run(["groupadd", "--force", ADMINS], check=True, capture_output=True)
        ensure_account(ALICE)
        ensure_account(BOB)
        ensure_account(CAROL, [ADMINS])
        cls.home = {u: os.path.expanduser("~" + u) for u in (ALICE, BOB, CAROL)}
        # Every user must reach the binaries, as from an installed package.
        path = os.path.abspath(BIN)
        while path != "/":
            if os.stat(path).st_mode & 0o005 != 0o005:
                raise unittest.SkipTest(f"{path} is not open to other users; the test users cannot run gpuq from it")
            path = os.path.dirname(path)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuq-lab-", dir="/tmp")
        os.chmod(self.tmp, 0o755)
        # gpuqd's own environment holds a secret of root's: no job, hook or supervisor may see it.
        env = dict(os.environ, GPUQ_TEST_ROOTS_SECRET=ROOTS_SECRET)
        if self.CONFIG is not None:
            config = os.path.join(self.tmp, "lab.json")
            with open(config, "w") as f:
                json.dump(self.CONFIG, f)
            env["GPUQ_CONFIG"] = config
        self.d = Daemon(self.tmp, "fake:2:16000", extra=["--multi-user", "--admin-group", ADMINS], env=env)
        self.d.socket = os.path.join(self.tmp, "run", "gpuqd.sock")  # the server makes run/ (0755)
        self.d.start(umask=0o027)  # as gpuqd-lab.service's UMask= has it
        # A file only root may read, written as a stream of valid event lines: were gpuqd to read
        # it for a job, the job's result would show its secret.
        self.secret = os.path.join(self.tmp, "secret.jsonl")
        with open(self.secret, "w") as f:
            f.write('{"type": "result", "secret": 42}\n')
        os.chmod(self.secret, 0o600)

    def tearDown(self):
        self.d.stop()
        for pid in pids_matching(f"gpuq-shim {self.tmp}/"):
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass
        wait_until(lambda: not pids_matching(f"gpuq-shim {self.tmp}/"), timeout=10, what="job supervisors to exit")
        failed = any(e for t, e in (self._outcome.result.errors + self._outcome.result.failures) if t is self)
        if failed:
            print(f"\nkept {self.tmp} for inspection")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def gpuq(self, user, *args, input=None):
        """The real gpuq, run as `user` from their home directory."""
        return subprocess.run(["runuser", "-u", user, "--", "env", "GPUQ_CONFIG=", os.path.join(BIN, "gpuq"),
                               "--socket", self.d.socket, *args],
                              input=input, capture_output=True, text=True, cwd=self.home[user], timeout=120)

    def ok(self, user, *args, input=None):
        r = self.gpuq(user, *args, input=input)
        self.assertEqual(r.returncode, 0, f"gpuq {' '.join(args)} as {user}: {r.stdout}{r.stderr}")
        return r.stdout

    def submit(self, user, spec, *extra):
        return json.loads(self.ok(user, "submit", "-", "--json", *extra, input=json.dumps(spec)))["ids"]

    def wait(self, user, ids):
        r = self.gpuq(user, "wait", *map(str, ids), "--json")
        return {j["id"]: j for j in json.loads(r.stdout)["jobs"]}

    def gated_job(self, name, shell, **spec):
        """Alice's job that runs `shell`, writes its supervisor's pid (its parent) to `ppid` in its
        attempt directory, and waits for the gate; returns (id, the supervisor's pid, the gate)."""
        gate = os.path.join(self.tmp, f"{name}.gate")
        script = (f'{shell}; d=$(dirname "$GPUQ_EVENTS"); echo $PPID > "$d/ppid.new" && mv "$d/ppid.new" "$d/ppid"; '
                  f'while [ ! -e {gate} ]; do sleep 0.02; done')
        [a] = self.submit(ALICE, {"name": name, "shell": script, **spec})
        ppid = os.path.join(self.d.state, "jobs", str(a), "attempt-1", "ppid")
        wait_until(lambda: os.path.exists(ppid), timeout=60, what="the job to start")
        with open(ppid) as f:
            return a, int(f.read()), gate

    def test_a_job_runs_under_a_supervisor_it_cannot_signal_trace_or_read(self):
        # The supervisor stays root (as slurmstepd does); only the ranks take their owner's identity.
        shell = ('for sig in STOP KILL TERM; do kill -$sig $PPID 2>/dev/null && echo "sent $sig"; done; '
                 'cat /proc/$PPID/environ > /dev/null 2>&1 && echo "read environ"; '
                 'ls /proc/$PPID/fd > /dev/null 2>&1 && echo "listed fds"; '
                 # PTRACE_ATTACH (16); a tracer's exit detaches it.
                 'python3 -c "import ctypes, sys; sys.exit(ctypes.CDLL(None).ptrace(16, $PPID, 0, 0) != 0)"; '
                 'echo "ptrace: $?"; id -u; echo done')
        a, shim, gate = self.gated_job("poke", shell, timeout_s=120)
        with open(f"/proc/{shim}/status") as f:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        self.assertEqual(status["Uid"].split()[:3], ["0", "0", "0"])  # real, effective, saved
        self.assertEqual(status["Uid"].split()[3], str(uid_of(ALICE)))  # it makes files as the owner
        self.assertEqual(status["State"][0], "S")  # not stopped
        open(gate, "w").close()
        job = self.wait(ALICE, [a])[a]
        self.assertEqual(job["state"], "succeeded", job["reason"])
        log = self.ok(ALICE, "logs", str(a))
        self.assertEqual(log.split()[-2:], [str(uid_of(ALICE)), "done"], log)
        for what in ("sent", "read environ", "listed fds"):
            self.assertNotIn(what, log)
        self.assertIn("ptrace: 1", log.splitlines())  # refused (not 0: attached; nor 127: not tried)

    def test_a_job_that_stops_and_kills_what_it_can_is_still_stopped_timed_out_and_torn_down_in_full(self):
        if self.CONFIG is not None:
            self.skipTest("LabMode runs it; the limits here change nothing of it")
        # Each job leaves a setsid child, SIGSTOPs every process of its owner's it can see (its
        # child too), tries to SIGKILL its supervisor, then ends, waits for its timeout, or waits to
        # be cancelled. One user each: a job stops every process of its owner's, another job's too.
        def attack(then):
            return ('d=$(dirname "$GPUQ_EVENTS"); '
                    'setsid sh -c \'echo $$ > "$0/child.new" && mv "$0/child.new" "$0/child"; exec sleep 1000\' "$d" & '
                    'while [ ! -e "$d/child" ]; do sleep 0.02; done; '
                    'for p in /proc/[0-9]*; do pid=${p#/proc/}; [ "$pid" = $$ ] || kill -STOP "$pid" 2>/dev/null; done; '
                    'kill -KILL $PPID 2>/dev/null && echo "killed its supervisor"; touch "$d/attacked"; ' + then)
        [ends] = self.submit(ALICE, {"name": "ends", "shell": attack("exit 0")})
        [times_out] = self.submit(BOB, {"name": "times-out", "shell": attack("exec sleep 1000"), "timeout_s": 15})
        [cancelled] = self.submit(CAROL, {"name": "cancelled", "gpus": 2, "shell": attack("exec sleep 1000")})
        attempt = lambda job: os.path.join(self.d.state, "jobs", str(job), "attempt-1")
        # No client runs as a user whose job is still stopping every process of theirs (it would stop it).
        wait_until(lambda: all(os.path.exists(os.path.join(attempt(j), "attacked")) for j in (ends, times_out, cancelled)),
                   timeout=60, what="the jobs to be done attacking")
        with open(os.path.join(attempt(cancelled), "child")) as f:
            child = int(f.read())
        # The next job on its GPUs starts only once nothing of it is left.
        follower = (f's=$(cut -d" " -f3 /proc/{child}/stat 2>/dev/null); '
                    f'if [ -n "$s" ] && [ "$s" != Z ]; then echo "overlap: {child} is $s"; exit 1; fi')
        [follows] = self.submit(CAROL, {"name": "follows", "gpus": 2, "shell": follower})
        self.ok(CAROL, "cancel", str(cancelled))
        jobs = {**self.wait(ALICE, [ends]), **self.wait(BOB, [times_out]), **self.wait(CAROL, [cancelled, follows])}
        for job, state in ((ends, "succeeded"), (times_out, "timed_out"), (cancelled, "cancelled"), (follows, "succeeded")):
            self.assertEqual(jobs[job]["state"], state, f"{jobs[job]['name']}: {jobs[job]['reason']}")
        for job, owner in ((ends, ALICE), (times_out, BOB), (cancelled, CAROL)):
            with open(os.path.join(attempt(job), "child")) as f:
                pid = int(f.read())
            self.assertFalse(os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z",
                             f"{jobs[job]['name']}: its setsid child {pid} outlived the attempt")
            self.assertNotIn("killed its supervisor", self.ok(owner, "logs", str(job)))

    def test_a_job_runs_in_its_attempts_cgroup_and_its_supervisor_lets_go_of_the_descriptor_that_put_it_there(self):
        if not self.d.cgroups:
            self.skipTest("this host gives gpuqd no cgroup to make attempts' cgroups under (see gpuqd.log)")
        a, shim, gate = self.gated_job("peek", "cat /proc/self/cgroup", timeout_s=120)
        # Opened as root for the ranks to join through (the attempt's cgroup in each hierarchy),
        # closed once they all have: no process of the attempt's (a leftover the supervisor reaps)
        # could ever come to hold one.
        fds = f"/proc/{shim}/fd"

        def holds_cgroup():
            for fd in os.listdir(fds):
                try:
                    if f"/{a}-attempt-1" in os.readlink(os.path.join(fds, fd)):
                        return True
                except FileNotFoundError:  # closed since the listing
                    pass
            return False
        wait_until(lambda: not holds_cgroup(), timeout=30, what="the supervisor to close the attempt's cgroups")
        open(gate, "w").close()
        job = self.wait(ALICE, [a])[a]
        self.assertEqual(job["state"], "succeeded", job["reason"])
        log = self.ok(ALICE, "logs", str(a))
        self.assertIn("/gpuq-", log)
        self.assertIn(f"/{a}-attempt-1", log)  # its own cgroup, joined as its user

    def test_a_job_can_neither_loosen_nor_leave_its_cgroups_nor_reach_its_neighbours(self):
        if not self.d.cgroups:
            self.skipTest("this host gives gpuqd no cgroup to make attempts' cgroups under (see gpuqd.log)")
        # As its owner, in each hierarchy it is in: raise its limits, enable controllers, freeze,
        # move itself up (to its attempt's, gpuqd's, the hierarchy's root), make a cgroup of its
        # own, and kill every attempt of gpuqd's. Each must be refused.
        attack = r"""
import os
mounts = []
for line in open("/proc/self/mountinfo"):
    f = line.split()
    kind = f[f.index("-") + 1]
    if kind in ("cgroup", "cgroup2") and f[3] == "/":
        mounts.append((kind == "cgroup2", set(f[-1].split(",")), f[4]))
def where(line):
    number, controllers, path = line.strip().split(":", 2)
    for v2, options, point in mounts:
        if (v2 and number == "0" and not controllers) or (not v2 and controllers and controllers.split(",")[0] in options):
            return point + path
first = open("/proc/self/cgroup").read()
done, tried, odd, visited = [], [], [], []
def attempt(what, act):
    tried.append(what)
    try:
        act()
        done.append(what)
    except PermissionError:  # EACCES, EPERM: refused, as it must be
        pass
    except OSError as e:  # refused for another reason: it would not show a guard at work
        odd.append(f"{what}: {e}")
def write(path, text):
    with open(path, "w") as f:
        f.write(text)
for line in first.splitlines():
    own = where(line)
    if not own or "/gpuq-" not in own:
        continue
    visited.append(own)
    base = own[:own.index("/", own.index("/gpuq-") + 1)]
    for name, text in (("pids.max", "max"), ("memory.max", "max"), ("memory.limit_in_bytes", "-1"),
                       ("memory.memsw.limit_in_bytes", "-1"), ("cpuset.cpus", "0-1023"),
                       ("cgroup.subtree_control", "+memory"), ("cgroup.freeze", "1"), ("freezer.state", "FROZEN")):
        if os.path.exists(os.path.join(own, name)):
            attempt(f"{own}/{name}", lambda: write(os.path.join(own, name), text))
    for up in {os.path.dirname(own), base, os.path.dirname(base)}:
        attempt(f"joined {up}", lambda: write(os.path.join(up, "cgroup.procs"), str(os.getpid())))
    attempt(f"made {own}/mine", lambda: os.mkdir(os.path.join(own, "mine")))
    attempt(f"killed {base}", lambda: write(os.path.join(base, "cgroup.kill"), "1"))
print("hierarchies:", len(visited), "tried:", len(tried), "done:", done, "odd:", odd,
      "moved:", open("/proc/self/cgroup").read() != first)
"""
        [a] = self.submit(ALICE, {"name": "loosen", "command": ["python3", "-c", attack], "memory_mb": 512, "cpus": 1})
        job = self.wait(ALICE, [a])[a]
        self.assertEqual(job["state"], "succeeded", job["reason"])
        said = self.ok(ALICE, "logs", str(a))
        self.assertIn("done: [] odd: [] moved: False", said)
        # Its cgroup in each hierarchy gpuqd uses, with a limit file, a cgroup above, a cgroup of
        # its own and gpuqd's cgroup.kill tried in each: four tries or more each.
        hierarchies = len(self.d.limit_cgroups | {self.d.cgroups})
        self.assertIn(f"hierarchies: {hierarchies} ", said)
        self.assertGreaterEqual(int(said.split("tried: ")[1].split()[0]), 4 * hierarchies, said)

    def test_a_jobs_files_are_made_under_umask_027_whatever_gpuqds(self):
        self.d.stop()
        self.d.start(umask=0o022)
        [a] = self.submit(ALICE, {"name": "files", "shell": 'touch "$GPUQ_CHECKPOINT_DIR/ckpt"'})
        job = self.wait(ALICE, [a])[a]
        self.assertEqual(job["state"], "succeeded", job["reason"])
        ckpt = os.path.join(job["job_dir"], "checkpoints", "ckpt")
        self.assertEqual(os.stat(ckpt).st_mode & 0o077, 0o040)  # its group's to read (admins), no one else's

    def test_jobs_run_as_their_owner_with_their_home_and_files(self):
        [a] = self.submit(ALICE, {"name": "who", "command": ["sh", "-c", 'id -u; echo "HOME=$HOME USER=$USER"; '
                                                            'grep NoNewPrivs /proc/self/status; '
                                                            'touch "$GPUQ_CHECKPOINT_DIR/ckpt"']})
        [b] = self.submit(BOB, {"name": "who", "command": ["id", "-u"]})
        jobs = self.wait(ALICE, [a, b])
        self.assertEqual(jobs[a]["state"], "succeeded", jobs[a]["reason"])
        self.assertEqual(jobs[b]["state"], "succeeded", jobs[b]["reason"])
        self.assertEqual((jobs[a]["user"], jobs[a]["uid"]), (ALICE, uid_of(ALICE)))
        self.assertEqual(jobs[b]["user"], BOB)
        log = self.ok(ALICE, "logs", str(a))
        self.assertIn(str(uid_of(ALICE)), log.split())
        self.assertIn(f"HOME={self.home[ALICE]} USER={ALICE}", log)
        # no_new_privs: no set-user-ID program the job runs gains root's privileges.
        self.assertIn("NoNewPrivs:\t1", log)
        self.assertIn(str(uid_of(BOB)), self.ok(BOB, "logs", str(b)).split())
        # Its files are its owner's; no other user reaches them.
        ckpt = os.path.join(jobs[a]["job_dir"], "checkpoints", "ckpt")
        self.assertEqual(os.stat(ckpt).st_uid, uid_of(ALICE))
        attempt = os.path.join(jobs[a]["job_dir"], "attempt-1")
        self.assertEqual(os.stat(os.path.join(attempt, "rank-0.log")).st_uid, uid_of(ALICE))
        peek = subprocess.run(["runuser", "-u", BOB, "--", "cat", os.path.join(attempt, "rank-0.log")],
                              capture_output=True, text=True)
        self.assertNotEqual(peek.returncode, 0)
        self.assertIn("Permission denied", peek.stderr)
        # The socket is every user's (0666), its directory passable by all (0755) whatever the umask.
        self.assertEqual(os.stat(self.d.socket).st_mode & 0o777, 0o666)
        self.assertEqual(os.stat(os.path.dirname(self.d.socket)).st_mode & 0o777, 0o755)
        # Everyone sees the queue, with whose each job is.
        table = self.ok(BOB, "status")
        self.assertIn("USER", table.splitlines()[0])
        self.assertIn(ALICE, table)

    def test_a_pid_file_pointed_at_a_process_not_its_supervisor_is_never_taken_or_signalled(self):
        # While no gpuqd runs, Alice (whose attempt directory it is) points her job's pid file at:
        # Bob's process; a process of root's (the user supervisors run as); a process of her own
        # whose command line is her job's supervisor's; one of a set-user-ID root program (as sudo
        # is) that she ran with that command line, root's by its effective uid. Each started here
        # (not under runuser, which a kill would leave behind), holding none of the test's pipes.
        def decoy(user, argv):
            p = subprocess.Popen(argv, user=user, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            self.addCleanup(lambda: (p.kill(), p.wait(), p.stdin.close()))
            return p

        suid_cat = os.path.join(self.tmp, "suid-cat")
        shutil.copy("/bin/cat", suid_cat)
        os.chmod(suid_cat, 0o4755)
        for who in ("bob", "root", "alice", "setuid"):
            gate = os.path.join(self.tmp, f"gate-{who}")
            [a] = self.submit(ALICE, {"name": "liar", "command": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]})
            wait_until(lambda: json.loads(self.ok(ALICE, "show", str(a), "--json"))["job"]["state"] == "running",
                       what="the job to start")
            attempt = os.path.join(json.loads(self.ok(ALICE, "show", str(a), "--json"))["job"]["job_dir"], "attempt-1")
            p = {"bob": lambda: decoy(uid_of(BOB), ["sleep", "300"]),
                 "root": lambda: decoy(0, ["sleep", "300"]),
                 "alice": lambda: decoy(uid_of(ALICE), ["cat", os.path.join(attempt, "launch.json"), "-"]),
                 "setuid": lambda: decoy(uid_of(ALICE), [suid_cat, os.path.join(attempt, "launch.json"), "-"])}[who]()
            if who == "setuid":  # (not on a nosuid mount)
                with open(f"/proc/{p.pid}/status") as f:
                    uids = next(line for line in f if line.startswith("Uid:")).split()[1:3]
                self.assertEqual(uids, [str(uid_of(ALICE)), "0"], "the set-user-ID decoy did not run as root")
            with open(f"/proc/{p.pid}/stat") as f:
                start = int(f.read().rsplit(")", 1)[1].split()[19])
            self.d.kill9()
            subprocess.run(["runuser", "-u", ALICE, "--", "sh", "-c", f'cat > {attempt}/shim.pid.new && '
                            f'mv -f {attempt}/shim.pid.new {attempt}/shim.pid'],
                           input=json.dumps({"pid": p.pid, "start_time": start}), text=True, check=True)
            self.d.start(umask=0o027)
            with open(os.path.join(self.tmp, "gpuqd.log")) as f:
                self.assertNotIn(f"supervisor pid {p.pid}", f.read(), who)
            self.gpuq(ALICE, "cancel", str(a))
            self.gpuq(CAROL, "cancel", str(a))  # an admin's cancel too
            self.d.wait_for_counter("scheduling_passes", more=0, at_least=1)
            self.assertIsNone(p.poll(), f"gpuqd signalled {who}'s process")
            open(gate, "w").close()
            self.wait(ALICE, [a])

    def test_with_a_socket_group_only_its_members_reach_gpuqd(self):
        import grp
        self.d.stop()
        self.d.extra += ["--socket-group", ADMINS]
        self.d.start(umask=0o027)
        st = os.stat(self.d.socket)
        self.assertEqual((st.st_mode & 0o777, st.st_gid), (0o660, grp.getgrnam(ADMINS).gr_gid))
        self.ok(CAROL, "status")  # a member
        r = self.gpuq(ALICE, "status")
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("Permission denied", r.stderr)

    def test_a_job_running_as_its_owner_is_found_again_after_gpuqd_is_killed(self):
        gate = os.path.join(self.tmp, "gate")
        drop = os.path.join(self.tmp, "drop")  # a directory the job (alice) may write
        os.mkdir(drop)
        os.chmod(drop, 0o1777)
        started = os.path.join(drop, "started")
        [a] = self.submit(ALICE, {"name": "long", "command": ["sh", "-c", f"touch {started}; "
                                                                          f"while [ ! -e {gate} ]; do sleep 0.05; done"]})
        # Its command runs: recorded running, its supervisor may not have announced itself yet, and
        # a gpuqd killed then finds it never started.
        wait_until(lambda: os.path.exists(started), what="the job to start")
        self.d.kill9()
        self.d.start(umask=0o027)
        with open(os.path.join(self.tmp, "gpuqd.log")) as f:
            self.assertIn(f"re-adopted job {a}", f.read())
        self.assertEqual(json.loads(self.ok(ALICE, "show", str(a), "--json"))["job"]["state"], "running")
        open(gate, "w").close()
        self.assertEqual(self.wait(ALICE, [a])[a]["state"], "succeeded")

    def test_another_users_job_cannot_be_touched_and_an_admin_may(self):
        [a] = self.submit(ALICE, {"name": "held", "command": ["true"]}, "--hold")
        for args in (["cancel", str(a)], ["release", str(a)], ["update", str(a), "--priority", "3"],
                     ["show", str(a)], ["logs", str(a)], ["result", str(a)], ["requeue", str(a)],
                     ["preempt", str(a)]):
            r = self.gpuq(BOB, *args)
            self.assertEqual(r.returncode, 5, f"gpuq {' '.join(args)} as bob: {r.stdout}{r.stderr}")
            self.assertIn(f"belongs to {ALICE}; only {ALICE} or an admin may", r.stderr)
        # What changes or reveals an ended job, and the --batch forms: each refused, nothing changed.
        [f] = self.submit(ALICE, {"name": "failing", "command": ["false"]})
        self.assertEqual(self.wait(ALICE, [f])[f]["state"], "failed")
        fb, ab = (str(json.loads(self.ok(ALICE, "show", str(i), "--json"))["job"]["batch"]) for i in (f, a))
        svg = os.path.join(self.tmp, "bob.svg")
        for args in (["restart", str(f)], ["restart", "--batch", fb], ["clean", str(f)], ["clean", "--batch", fb],
                     ["clean", str(f), "--forget"], ["plot", str(f), "-o", svg], ["hold", str(a)],
                     ["hold", "--batch", ab], ["release", "--batch", ab], ["cancel", "--batch", ab],
                     ["update", "--batch", ab, "--priority", "5"]):
            r = self.gpuq(BOB, *args)
            self.assertEqual(r.returncode, 5, f"gpuq {' '.join(args)} as bob: {r.stdout}{r.stderr}")
        self.assertFalse(os.path.exists(svg))
        after = json.loads(self.ok(ALICE, "show", str(f), "--json"))
        self.assertEqual((after["job"]["state"], after["job"]["attempt"]), ("failed", 1))
        self.assertTrue(os.path.isdir(after["job"]["job_dir"]))
        self.assertEqual(json.loads(self.ok(ALICE, "show", str(a), "--json"))["job"]["state"], "queued")
        self.assertEqual(self.gpuq(BOB, "drain", "0").returncode, 5)
        self.assertEqual(self.gpuq(BOB, "undrain", "0").returncode, 5)
        self.assertEqual(self.gpuq(BOB, "daemon", "stop").returncode, 5)
        self.ok(CAROL, "show", str(a))  # an admin, through the admin group
        self.ok(CAROL, "cancel", str(a))
        self.assertEqual(self.wait(ALICE, [a])[a]["state"], "cancelled")
        # Bob's job may wait for Alice's: reading its state is everyone's.
        [b1] = self.submit(ALICE, {"name": "first", "command": ["true"]})
        [b2] = self.submit(BOB, {"name": "second", "command": ["true"], "after": [b1]})
        self.assertEqual(self.wait(BOB, [b2])[b2]["state"], "succeeded")

    def watch_as(self, user, request, background=False):
        """One raw request on a connection of `user`'s own: its reply (or, in the background, the
        process that will print it)."""
        script = ("import json, socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
                  "s.sendall(sys.argv[2].encode() + b'\\n'); f = s.makefile(); print(f.readline(), end='')")
        argv = ["runuser", "-u", user, "--", "python3", "-c", script, self.d.socket, json.dumps(request)]
        if background:
            return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_a_watch_shows_another_user_s_job_changing_but_never_its_progress(self):
        start = self.watch_as(BOB, {"cmd": "watch"})
        gates = [os.path.join(self.tmp, f"gate{i}") for i in (1, 2)]
        step = 'echo \'{"type": "progress", "secret_step_%d": 1}\' >> "$GPUQ_EVENTS"'
        [a] = self.submit(ALICE, {"name": "private", "shell": "; ".join([
            step % 1, f"while [ ! -e {gates[0]} ]; do sleep 0.05; done",
            step % 2, f"while [ ! -e {gates[1]} ]; do sleep 0.05; done"])})
        wait_until(lambda: "secret_step_1" in self.ok(ALICE, "status", "--json"), what="the first progress event")
        cursor = {"epoch": start["epoch"], "after": start["cursor"], "timeout_s": 0}
        mine = self.watch_as(ALICE, {"cmd": "watch", **cursor})
        self.assertIn("secret_step_1", json.dumps(mine["jobs"]))
        seen = self.watch_as(BOB, {"cmd": "watch", **cursor})
        self.assertEqual([(j["id"], j["state"], j["details_hidden"]) for j in seen["jobs"]], [(a, "running", True)])
        self.assertNotIn("secret_step", json.dumps(seen))
        # Held for Bob: the job's next progress is no news to him; its end is.
        bob = self.watch_as(BOB, {"cmd": "watch", "epoch": seen["epoch"], "after": seen["cursor"], "ids": [a],
                                  "timeout_s": 120}, background=True)
        wait_until(lambda: json.loads(self.ok(CAROL, "gpus", "--json"))["watches_held"] == 1, what="Bob's watch")
        open(gates[0], "w").close()
        wait_until(lambda: "secret_step_2" in self.ok(ALICE, "status", "--json"), what="the second progress event")
        self.assertEqual(json.loads(self.ok(CAROL, "gpus", "--json"))["watches_held"], 1)
        open(gates[1], "w").close()
        out, err = bob.communicate(timeout=120)
        ended = json.loads(out)
        self.assertEqual([(j["id"], j["state"]) for j in ended["jobs"]], [(a, "succeeded")])
        self.assertNotIn("secret_step", out)

    def test_one_visibility_rule_for_every_command_owner_other_user_and_admin(self):
        # Alice's jobs carry private details: a result, a label, progress, a failure quoting its log.
        release = os.path.join(self.tmp, "release")
        [done] = self.submit(ALICE, {"name": "done", "labels": {"project": "lbl-private-1"}, "command": [
            "sh", "-c", 'echo \'{"type": "result", "res_private_2": 1}\' >> "$GPUQ_EVENTS"']})
        [failed] = self.submit(ALICE, {"name": "failed", "command": ["sh", "-c", "echo log-private-3; exit 3"]})
        [running] = self.submit(ALICE, {"name": "running", "command": [
            "sh", "-c", f'echo \'{{"type": "progress", "prog_private_4": 1}}\' >> "$GPUQ_EVENTS"; '
                        f'while [ ! -e {release} ]; do sleep 0.1; done']})
        self.wait(ALICE, [done, failed])
        wait_until(lambda: "prog_private_4" in self.ok(ALICE, "status"), what="the progress event")
        secrets = ("lbl-private-1", "res_private_2", "log-private-3", "prog_private_4")
        ids = [str(done), str(failed), str(running)]
        # (command, what an owner or admin sees of the secrets, another user refused, exit status otherwise)
        table = [
            (["status"], {"res_private_2", "log-private-3", "prog_private_4"}, False, 0),
            (["status", "--json"], set(secrets), False, 0),
            (["status", "--all", "--json"], set(secrets), False, 0),
            (["wait", str(done), str(failed), "--json"], {"lbl-private-1", "res_private_2", "log-private-3"}, False, 1),
            (["why", str(failed), "--json"], {"log-private-3"}, False, 0),
            (["why", str(running), "--json"], {"prog_private_4"}, False, 0),
            (["top", "--once"], {"res_private_2", "log-private-3"}, False, 0),
            (["gpus", "--json"], set(), False, 0),
            (["show", str(done), "--json"], {"lbl-private-1", "res_private_2"}, True, 0),
            (["show", str(failed)], {"log-private-3"}, True, 0),
            (["result", str(done), "--json"], {"res_private_2"}, True, 0),
            (["results", *ids, "--json"], {"lbl-private-1", "res_private_2"}, True, 0),
            (["logs", str(failed)], {"log-private-3"}, True, 0),
            (["events", str(running), "--json"], {"prog_private_4"}, True, 0),
        ]
        for args, seen, refused, status in table:
            for user in (ALICE, CAROL, BOB):
                with self.subTest(command=" ".join(args), user=user):
                    r = self.gpuq(user, *args)
                    out = r.stdout + r.stderr
                    if user == BOB:
                        self.assertEqual(r.returncode, 5 if refused else status, out)
                        if refused:
                            self.assertIn(f"belongs to {ALICE}; only {ALICE} or an admin may", r.stderr)
                        self.assertEqual([x for x in secrets if x in out], [], out)
                    else:
                        self.assertEqual(r.returncode, status, out)
                        self.assertEqual({x for x in secrets if x in out}, seen, out)
        # What everyone sees of Alice's jobs: squeue's columns, gpuq's own words, and that the rest is hers.
        jobs = {j["id"]: j for j in json.loads(self.ok(BOB, "status", "--json"))["jobs"]}
        self.assertEqual((jobs[failed]["name"], jobs[failed]["user"], jobs[failed]["state"], jobs[failed]["exit_code"]),
                         ("failed", ALICE, "failed", 3))
        self.assertTrue(all(jobs[i]["details_hidden"] for i in (done, failed, running)))
        self.assertIn(f"(details: {ALICE}'s to read)", self.ok(BOB, "status"))
        open(release, "w").close()

    def preemptible(self, name, gate, gpus=1, **spec):
        """A job that holds `gpus` GPUs until the gate opens, and is preemptible."""
        return {"name": name, "gpus": gpus, "preemptible": True, "timeout_s": 300, **spec,
                "command": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]}

    def job(self, user, job_id):
        return json.loads(self.ok(user, "show", str(job_id), "--json"))["job"]

    def test_a_user_preempts_their_own_jobs_only_by_default(self):
        gate = os.path.join(self.tmp, "gate")
        [victim] = self.submit(ALICE, self.preemptible("a-low", gate, gpus=2))
        wait_until(lambda: self.job(ALICE, victim)["state"] == "running", what="alice's job to start")
        [bobs] = self.submit(BOB, {**self.preemptible("b-urgent", gate), "preemptible": False, "priority": 10})
        wait_until(lambda: "waiting" in self.job(BOB, bobs)["reason"], what="a pass to look at bob's job")
        self.assertFalse(self.job(ALICE, victim)["preempting"])  # another user's: left alone
        r = self.gpuq(BOB, "preempt", str(victim))
        self.assertEqual(r.returncode, 5, r.stderr)
        self.assertIn(f"belongs to {ALICE}; only {ALICE} or an admin may", r.stderr)
        # Alice's own urgent job preempts it; once it has stopped both urgent jobs run.
        [alices] = self.submit(ALICE, {**self.preemptible("a-urgent", gate), "preemptible": False, "priority": 10})
        wait_until(lambda: all(self.job(u, j)["state"] == "running" for u, j in ((ALICE, alices), (BOB, bobs))),
                   what="both urgent jobs to run")
        low = self.job(ALICE, victim)
        self.assertEqual((low["state"], low["preempted_by"], low["preemptions"]),
                         ("queued", f"job {alices} (a-urgent)", 1))
        open(gate, "w").close()
        jobs = self.wait(ALICE, [victim, alices, bobs])
        self.assertEqual({j["state"] for j in jobs.values()}, {"succeeded"}, jobs)

    def test_with_fair_share_a_user_under_their_share_preempts_one_over_it_and_no_further(self):
        config = dict(self.CONFIG or {}, preempt_across_users="fair_share")
        path = os.path.join(self.tmp, "preempt.json")
        with open(path, "w") as f:
            json.dump(config, f)
        self.d.stop()
        self.d.env = dict(self.d.env, GPUQ_CONFIG=path)
        self.d.start(umask=0o027)
        gate = os.path.join(self.tmp, "gate")
        victims = self.submit(ALICE, [self.preemptible(f"a-low{i}", gate) for i in range(2)])
        wait_until(lambda: all(self.job(ALICE, v)["state"] == "running" for v in victims),
                   what="alice's jobs to hold both GPUs")
        # Two GPUs, two users: a share of 1. Bob's first job takes him to 1, from Alice's 2; his
        # second would take him past it, and preempts nothing.
        urgent = self.submit(BOB, [{**self.preemptible(f"b-urgent{i}", gate), "preemptible": False, "priority": 10}
                                   for i in range(2)])
        wait_until(lambda: self.job(BOB, urgent[0])["state"] == "running", what="bob's first job to start")
        self.assertEqual(self.job(BOB, urgent[1])["state"], "queued")
        self.assertEqual(sorted(self.job(ALICE, v)["preemptions"] for v in victims), [0, 1])
        open(gate, "w").close()
        jobs = self.wait(ALICE, victims + urgent)
        self.assertEqual({j["state"] for j in jobs.values()}, {"succeeded"}, jobs)
        self.assertEqual(sorted(jobs[v]["preemptions"] for v in victims), [0, 1])

    def test_a_job_cannot_make_gpuqd_read_a_file_its_owner_cannot(self):
        link = {"name": "symlink", "command": ["sh", "-c", f'ln -sf {self.secret} "$GPUQ_EVENTS"']}
        # A hard link to the root-only file needs protected_hardlinks off (as on some machines).
        # Under protected_hardlinks a user may link a file they can read and write: root's 0666
        # file here, and the job fails unless the link was made. Only gpuqd's check of the file's
        # owner (not O_NOFOLLOW: a hard link is no symlink) keeps it from being the job's events.
        shared = os.path.join(self.tmp, "shared.jsonl")
        with open(shared, "w") as f:
            f.write('{"type": "result", "shared": 1}\n')
        os.chmod(shared, 0o666)
        hard = {"name": "hardlink", "command": ["sh", "-c", f'rm -f "$GPUQ_EVENTS"; ln {shared} "$GPUQ_EVENTS"']}
        root_only = {"name": "hardlink-root-only", "command": ["sh", "-c", f'rm -f "$GPUQ_EVENTS"; ln {self.secret} "$GPUQ_EVENTS" || true']}
        fifo = {"name": "fifo", "command": ["sh", "-c", 'rm -f "$GPUQ_EVENTS"; mkfifo "$GPUQ_EVENTS"']}
        read = {"name": "read", "command": ["cat", self.secret]}
        ids = self.submit(ALICE, [link, hard, root_only, fifo, read])
        jobs = self.wait(ALICE, ids)
        for i in ids[:4]:
            self.assertEqual(jobs[i]["state"], "succeeded", (jobs[i], self.ok(ALICE, "logs", str(i))))
            self.assertIsNone(jobs[i]["result"], jobs[i])
            self.assertEqual(json.loads(self.ok(ALICE, "events", str(i), "--json"))["events"], [])
        self.assertEqual(os.stat(shared).st_nlink, 2)  # the job's link is there, in its attempt directory
        self.assertEqual(jobs[ids[4]]["state"], "failed")
        self.assertIn("Permission denied", self.ok(ALICE, "logs", str(ids[4])))
        with open(self.secret) as f:  # untouched
            self.assertEqual(f.read(), '{"type": "result", "secret": 42}\n')
        self.assertEqual(os.stat(self.secret).st_uid, 0)

    def test_reading_a_jobs_log_follows_no_link_and_waits_on_no_fifo_as_root_an_admin_or_its_owner(self):
        # The job swaps its own rank-0.log for a link to a root-only file, or for a fifo.
        log = 'log="$(dirname "$GPUQ_EVENTS")/rank-0.log"; rm "$log"; '
        ids = self.submit(ALICE, [{"name": "link", "command": ["sh", "-c", log + f'ln -s {self.secret} "$log"']},
                                  {"name": "fifo", "command": ["sh", "-c", log + 'mkfifo "$log"']}])
        jobs = self.wait(ALICE, ids)
        self.assertTrue(all(j["state"] == "succeeded" for j in jobs.values()), jobs)
        as_root = lambda *a: subprocess.run([os.path.join(BIN, "gpuq"), "--socket", self.d.socket, *a], input="",
                                            capture_output=True, text=True, timeout=30, env=dict(os.environ, GPUQ_CONFIG=""))
        for job_id, said in zip(ids, ("is a symbolic link, not followed", "is not a regular file")):
            for who, run in (("root", as_root), (CAROL, lambda *a: self.gpuq(CAROL, *a)),
                             (ALICE, lambda *a: self.gpuq(ALICE, *a))):
                for args in (["logs", str(job_id)], ["logs", str(job_id), "--tail", "5"]):
                    with self.subTest(job=job_id, user=who, args=args):
                        r = run(*args)  # a fifo waited on would run into the timeout
                        self.assertNotIn("secret", r.stdout + r.stderr)
                        self.assertIn(said, r.stderr)

    def test_a_job_that_makes_its_attempt_directory_read_only_is_still_recorded(self):
        # Its supervisor runs as the job's owner, so the job can take the write bit off the
        # directory the exit record goes in; the supervisor, the owner too, puts it back.
        [a] = self.submit(ALICE, {"name": "ro", "command": ["sh", "-c", 'chmod 0500 "$(dirname "$GPUQ_EVENTS")"']})
        self.assertEqual(self.wait(ALICE, [a])[a]["state"], "succeeded")

    def test_a_directory_or_command_the_owner_cannot_reach_is_refused_at_submit(self):
        private = os.path.join(self.tmp, "private")
        os.mkdir(private, 0o700)
        r = self.gpuq(ALICE, "submit", "-", input=json.dumps({"command": ["true"], "cwd": private}))
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn(f"cwd {private} cannot be the job's working directory (Permission denied, as {ALICE})", r.stderr)
        tool = os.path.join(private, "tool")
        with open(tool, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(tool, 0o755)
        r = self.gpuq(ALICE, "submit", "-", input=json.dumps({"command": [tool]}))
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn(f"command `{tool}` is not an executable file", r.stderr)

    def test_each_user_cleans_only_their_own_ended_jobs(self):
        [a] = self.submit(ALICE, {"name": "a", "command": ["true"]})
        [b] = self.submit(BOB, {"name": "b", "command": ["true"]})
        self.wait(ALICE, [a, b])
        out = json.loads(self.ok(BOB, "clean", "--older-than", "0s", "--json"))
        self.assertEqual(out["cleaned"], [b])
        self.assertTrue(os.path.isdir(os.path.join(self.d.state, "jobs", str(a))))
        self.assertFalse(os.path.exists(os.path.join(self.d.state, "jobs", str(b))))


    def test_a_jobs_on_finish_hook_runs_as_its_owner(self):
        out = os.path.join(self.home[ALICE], "hook-out")
        [a] = self.submit(ALICE, {"name": "hooked", "command": ["true"],
                                  "on_finish": ["sh", "-c", f'id -u > {out}.new; cat >> {out}.new; mv {out}.new {out}']})
        self.assertEqual(self.wait(ALICE, [a])[a]["state"], "succeeded")
        wait_until(lambda: os.path.exists(out), what="the hook's output")
        with open(out) as f:
            uid, show = f.read().split("\n", 1)
        self.assertEqual(int(uid), uid_of(ALICE))
        self.assertEqual(json.loads(show)["job"]["user"], ALICE)
        self.assertEqual(os.stat(out).st_uid, uid_of(ALICE))

    def raw(self, user, request):
        """One request on the socket as `user`, written by hand (a client of their own, not gpuq)."""
        code = ("import json, socket, sys\n"
                "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(sys.argv[2].encode() + b'\\n')\n"
                "buf = b''\n"
                "while not buf.endswith(b'\\n'):\n"
                "    chunk = s.recv(65536)\n"
                "    if not chunk: break\n"
                "    buf += chunk\n"
                "print(buf.decode())\n")
        r = subprocess.run(["runuser", "-u", user, "--", "python3", "-c", code, self.d.socket, json.dumps(request)],
                           capture_output=True, text=True, timeout=60, cwd=self.home[user])
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_a_client_that_sends_no_environment_gets_a_minimal_one_of_its_owners_never_gpuqds(self):
        out = os.path.join(self.home[ALICE], "hook-env")
        dump = f"env > {out}.$GPUQ_JOB_STATE.new; mv {out}.$GPUQ_JOB_STATE.new {out}.hook"
        reply = self.raw(ALICE, {"cmd": "submit", "cwd": self.home[ALICE], "env": {},
                                 "jobs": {"name": "bare", "command": ["env"], "on_finish": ["sh", "-c", dump]}})
        self.assertTrue(reply["ok"], reply)
        [a] = reply["ids"]
        self.assertEqual(self.wait(ALICE, [a])[a]["state"], "succeeded")
        wait_until(lambda: os.path.exists(out + ".hook"), what="the hook's output")
        with open(out + ".hook") as f:
            hook = dict(line.split("=", 1) for line in f.read().splitlines() if "=" in line)
        job = dict(line.split("=", 1) for line in self.ok(ALICE, "logs", str(a)).splitlines() if "=" in line)
        for env in (job, hook):
            self.assertNotIn("GPUQ_TEST_ROOTS_SECRET", env)
            self.assertEqual((env["HOME"], env["USER"], env["LOGNAME"]), (self.home[ALICE], ALICE, ALICE))
            self.assertEqual((env["PATH"], env["SHELL"], env["LANG"]), ("/usr/local/bin:/usr/bin:/bin", "/bin/sh", "C.UTF-8"))
        self.assertEqual(job["GPUQ_JOB_ID"], str(a))
        # What a client sends is what its jobs get, over nothing of gpuqd's.
        reply = self.raw(ALICE, {"cmd": "submit", "cwd": self.home[ALICE], "env": {"ONLY": "this"},
                                 "jobs": {"name": "sent", "command": ["env"]}})
        [b] = reply["ids"]
        self.assertEqual(self.wait(ALICE, [b])[b]["state"], "succeeded")
        log = self.ok(ALICE, "logs", str(b))
        self.assertIn("ONLY=this", log.splitlines())
        self.assertNotIn(ROOTS_SECRET, log)

    def test_a_jobs_supervisor_holds_none_of_gpuqds_environment(self):
        a, shim, gate = self.gated_job("peek", "true", timeout_s=120)
        with open(f"/proc/{shim}/comm") as f:
            self.assertEqual(f.read().strip(), "gpuq-shim")  # its supervisor's, not another's
        with open(f"/proc/{shim}/environ", "rb") as f:
            env = f.read().decode().split("\0")
        open(gate, "w").close()
        self.assertEqual(self.wait(ALICE, [a])[a]["state"], "succeeded")
        self.assertNotIn(ROOTS_SECRET, "\n".join(env))
        self.assertIn("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", env)

    def test_gpus_name_whose_processes_outside_gpuq_hold_memory_and_packing_leaves_it_to_them(self):
        # Bob runs something on GPU 0 himself, outside gpuq (a notebook), holding 12000 of its 16000 MiB.
        bob = subprocess.Popen(["setpriv", f"--reuid={uid_of(BOB)}", f"--regid={uid_of(BOB)}", "--clear-groups",
                                "sleep", "7404"])
        self.addCleanup(bob.wait)
        self.addCleanup(bob.kill)
        devices = os.path.join(self.tmp, "nvml-devices")
        with open(devices, "w") as f:
            f.write(f"GPU-aaaa L4 16000 0 0 1 0 0 0 - {bob.pid}:12000\nGPU-bbbb L4 16000 0 0 2 0 0 0\n")
        self.d.stop()
        socket = self.d.socket
        self.d = Daemon(self.tmp, "nvml", extra=["--multi-user", "--admin-group", ADMINS],
                        env=dict(os.environ, LD_LIBRARY_PATH=FAKE_NVML_DIR, GPUQ_FAKE_NVML=devices))
        self.d.socket = socket
        self.d.start(umask=0o027)
        gpus = json.loads(self.ok(ALICE, "gpus", "--json"))["gpus"]
        self.assertEqual([(p["pid"], p["user"], p["command"], p["used_mb"], p["job"]) for p in gpus[0]["processes"]],
                         [(bob.pid, BOB, "sleep", 12000, None)])
        self.assertEqual((gpus[0]["foreign_mb"], gpus[1]["foreign_mb"]), (12000, 0))
        self.assertRegex(self.ok(ALICE, "gpus"), rf"\n0 +{bob.pid} +{BOB} +sleep +12000 MiB +outside gpuq\n")
        # Alice's 8000 MiB would best fit on GPU 0 were it empty; it has 4000 MiB free, so GPU 1.
        [a] = self.submit(ALICE, {"name": "packed", "gpus": 1, "shared": True, "gpu_memory_mb": 8000,
                                  "command": ["true"]})
        job = self.wait(ALICE, [a])[a]
        self.assertEqual((job["state"], job["gpus"]), ("succeeded", [1]))


class LabSharing(LabMode):
    """Fair share and per-user limits (docs/lab.md, "Sharing the GPUs")."""
    CONFIG = {"user_limits": {BOB: {"max_running": 1}, CAROL: {"max_gpus": 1, "max_queued": 6}, "*": {"max_queued": 6}},
              "max_priority": 10, "usage_half_life_s": 60, "connections_per_user": 12}

    # The LabMode tests run here too, under limits that do not bind them.

    def gated(self, name, gate):
        return {"name": name, "gpus": 1, "command": ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]}

    def running(self, user):
        jobs = json.loads(self.ok(user, "status", "--json"))["jobs"]
        return sorted((j["user"], j["name"]) for j in jobs if j["state"] == "running")

    def test_equal_priority_sweeps_of_two_users_share_the_gpus_the_least_recent_user_first(self):
        first, second = os.path.join(self.tmp, "first"), os.path.join(self.tmp, "second")
        early = self.submit(ALICE, [self.gated(f"a-early{i}", first) for i in range(2)])
        wait_until(lambda: len(self.running(ALICE)) == 2, what="alice's first jobs to hold both GPUs")
        late_a = self.submit(ALICE, [self.gated(f"a{i}", second) for i in range(3)])  # in line first
        late_b = self.submit(BOB, [self.gated("b0", second)])
        open(first, "w").close()  # both GPUs free at once: alice has used them, bob has not
        wait_until(lambda: len(self.running(ALICE)) == 2 and ("gpuq-alice", "a-early0") not in self.running(ALICE),
                   what="the next two jobs to start")
        # In submission order alice's a0 and a1 would take both GPUs; fair share gives bob one.
        self.assertEqual(self.running(BOB), [(ALICE, "a0"), (BOB, "b0")])
        usage = {u["user"]: u for u in json.loads(self.ok(BOB, "usage", "--json"))["users"]}
        self.assertGreater(usage[ALICE]["gpu_hours"], 0)
        self.assertEqual((usage[BOB]["running"], usage[BOB]["gpus"], usage[BOB]["max_running"]), (1, 1, 1))
        self.assertEqual(usage[ALICE]["queued"], 2)
        self.assertIn("GPU-HOURS", self.ok(ALICE, "usage"))
        open(second, "w").close()
        jobs = self.wait(ALICE, early + late_a + late_b)
        self.assertTrue(all(j["state"] == "succeeded" for j in jobs.values()), jobs)

    def test_one_users_connections_are_bounded_and_the_others_still_get_in(self):
        # Bob opens 16 connections and asks on each; past his 12, each is refused and closed.
        # Each asks at once, as gpuq does, and all of it is sent while gpuqd is stopped: a refusal
        # must reach its client although the client's request lies unread when gpuqd closes.
        script = ("import json, socket, sys\n"
                  "conns = []\n"
                  "for _ in range(16):\n"
                  "    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); conns.append(s)\n"
                  "    s.sendall(b'{\"cmd\": \"status\", \"limit\": 0}\\n')\n"
                  "print('sent', flush=True)\n"
                  "said = []\n"
                  "for s in conns:\n"
                  "    said.append(json.loads(s.makefile().readline()))\n"
                  "print(json.dumps(said), flush=True)\n"
                  "sys.stdin.read()\n")

        def sixteen(user):
            with self.d.paused():
                p = subprocess.Popen(["runuser", "-u", user, "--", "python3", "-c", script, self.d.socket],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                sent = p.stdout.readline()
            self.assertEqual(sent, "sent\n", p.stderr.read() if p.poll() is not None else "")
            said = json.loads(p.stdout.readline() or "null")
            self.assertIsNotNone(said, p.stderr.read() if p.poll() is not None else "")
            return p, said

        bob, said = sixteen(BOB)
        refused = [r["error"] for r in said if not r["ok"]]
        self.assertEqual(len(said) - len(refused), 12)
        self.assertEqual(len(refused), 4)
        self.assertEqual(refused[0]["code"], "too_large")
        self.assertIn("you have 12 connections to gpuqd open, the most one user may (connections_per_user)",
                      refused[0]["message"])
        # The CLI says why (the refusal is read, not lost to a reset).
        r = self.gpuq(BOB, "status")
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn("you have 12 connections to gpuqd open", r.stderr)
        # While he holds his 12, Alice is served, and so is an admin.
        self.ok(ALICE, "status")
        self.ok(CAROL, "gpus")
        bob.stdin.close()
        self.assertEqual(bob.wait(timeout=60), 0)
        # Closed, they no longer count: he gets in again.
        self.ok(BOB, "status")
        # An admin has no such bound.
        carol, said = sixteen(CAROL)
        self.assertTrue(all(r["ok"] for r in said), said)
        carol.stdin.close()
        self.assertEqual(carol.wait(timeout=60), 0)

    def test_users_take_turns_on_gpuqds_thread(self):
        # Bob's 5 connections and then Alice's one each send a submit while gpuqd is stopped, so
        # all 6 are read in one go. Users take turns (daemon/turns.hpp): Alice's is answered after
        # Bob's first, not after all 5 of his (it was); job ids show the order they ran in.
        script = ("import json, os, socket, sys\n"
                  "conns = []\n"
                  "for _ in range(int(sys.argv[2])):\n"
                  "    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); conns.append(s)\n"
                  "    s.sendall(b'{\"cmd\": \"hello\", \"protocol_version\": 1}\\n')\n"
                  "    assert json.loads(s.makefile().readline())['ok']\n"
                  "print('ready', flush=True)\n"
                  "sys.stdin.readline()\n"
                  "req = {'cmd': 'submit', 'jobs': {'command': ['true']}, 'cwd': os.getcwd(), 'hold': True,\n"
                  "       'env': {'PATH': '/usr/bin:/bin'}}\n"
                  "for s in conns:\n"
                  "    s.sendall((json.dumps(req) + '\\n').encode())\n"
                  "print('sent', flush=True)\n"
                  "print(json.dumps([json.loads(s.makefile().readline())['ids'][0] for s in conns]), flush=True)\n")

        def user(name, n):
            p = subprocess.Popen(["runuser", "-u", name, "--", "python3", "-c", script, self.d.socket, str(n)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 cwd=self.home[name])
            self.assertEqual(p.stdout.readline(), "ready\n", p.stderr.read() if p.poll() is not None else "")
            return p

        bob, alice = user(BOB, 5), user(ALICE, 1)
        # Each hello's answer can reach its client before gpuqd has run the handler that waits for
        # the next request on its connection; a request through gpuqd after them runs after those.
        self.ok(CAROL, "gpus")
        with self.d.paused():
            for p in (bob, alice):  # Bob's requests arrive first
                p.stdin.write("go\n")
                p.stdin.flush()
                self.assertEqual(p.stdout.readline(), "sent\n", p.stderr.read() if p.poll() is not None else "")
        bobs, [alices] = (json.loads(p.stdout.readline() or "null") for p in (bob, alice))
        for p in (bob, alice):
            self.assertEqual(p.wait(timeout=60), 0, p.stderr.read())
        self.assertEqual(sorted(bobs + [alices]).index(alices), 1, f"bob's {bobs}, alice's {alices}")

    def test_a_users_limits_hold_and_say_so(self):
        gate = os.path.join(self.tmp, "gate")
        ids = self.submit(BOB, [self.gated(f"b{i}", gate) for i in range(2)])
        wait_until(lambda: len(self.running(BOB)) == 1, what="bob's first job to start")
        waiting = json.loads(self.ok(BOB, "show", str(ids[1]), "--json"))["job"]
        self.assertEqual(waiting["state"], "queued")
        self.assertEqual(waiting["reason"], f"{BOB} runs 1 jobs, their limit (max_running 1)")
        # A GPU stays free for others: bob's waiting job reserves nothing.
        [a] = self.submit(ALICE, [self.gated("a", gate)])
        wait_until(lambda: (ALICE, "a") in self.running(ALICE), what="alice's job to take the free GPU")
        # max_queued 6: alice has 1, 6 more would make 7.
        r = self.gpuq(ALICE, "submit", "-", input=json.dumps([{"command": ["true"]}] * 6))
        self.assertEqual(r.returncode, 5, r.stderr)
        self.assertIn(f"{ALICE} has 1 jobs queued or running; 6 more would pass their limit (max_queued 6)", r.stderr)
        # Priorities over max_priority are an admin's.
        r = self.gpuq(ALICE, "submit", "-", input=json.dumps({"command": ["true"], "priority": 50}))
        self.assertEqual(r.returncode, 5, r.stderr)
        self.assertIn("priority 50 is above this machine's ceiling (max_priority 10)", r.stderr)
        self.assertEqual(self.gpuq(ALICE, "update", str(a), "--priority", "11").returncode, 5)
        [c] = self.submit(CAROL, {"command": ["true"], "priority": 50})
        open(gate, "w").close()
        jobs = self.wait(BOB, ids + [a, c])
        self.assertTrue(all(j["state"] == "succeeded" for j in jobs.values()), jobs)

    def test_gpu_use_is_forgotten_at_the_half_life(self):
        [a] = self.submit(ALICE, {"name": "use", "gpus": 1, "command": ["sleep", "1"]})
        self.assertEqual(self.wait(ALICE, [a])[a]["state"], "succeeded")

        def hours():
            t0 = time.time()
            users = {u["user"]: u for u in json.loads(self.ok(BOB, "usage", "--json"))["users"]}
            return t0, users[ALICE]["gpu_hours"], time.time()
        before1, h1, after1 = hours()
        time.sleep(3)  # the interval measured, not a wait for something to happen
        before2, h2, after2 = hours()
        self.assertGreater(h1, 0)
        # gpuqd read its clock somewhere within each request: the decay over 60 s half-lives lies
        # between what the shortest and the longest interval allow.
        lo, hi = 2 ** (-(after2 - before1) / 60), 2 ** (-(before2 - after1) / 60)
        self.assertTrue(lo * h1 <= h2 <= hi * h1, (h1, h2, lo, hi))

    def test_max_gpus_holds_a_users_gpus_and_the_free_one_goes_to_another(self):
        gate = os.path.join(self.tmp, "gate")
        ids = self.submit(CAROL, [self.gated(f"c{i}", gate) for i in range(2)])
        wait_until(lambda: len(self.running(CAROL)) == 1, what="carol's first job to start")
        waiting = json.loads(self.ok(CAROL, "show", str(ids[1]), "--json"))["job"]
        self.assertEqual(waiting["state"], "queued")
        self.assertEqual(waiting["reason"], f"{CAROL} holds 1 GPUs; 1 more would pass their limit (max_gpus 1)")
        [a] = self.submit(ALICE, [self.gated("a", gate)])  # the second GPU is not held for carol
        wait_until(lambda: (ALICE, "a") in self.running(ALICE), what="alice's job to take the free GPU")
        self.assertEqual(json.loads(self.ok(CAROL, "show", str(ids[1]), "--json"))["job"]["state"], "queued")
        open(gate, "w").close()
        jobs = self.wait(CAROL, ids + [a])
        self.assertTrue(all(j["state"] == "succeeded" for j in jobs.values()), jobs)

    def test_max_queued_holds_on_every_path_that_queues_jobs(self):
        # Queue to the limit held, cancel, queue to the limit again, then restart the cancelled:
        # restart queues jobs as surely as submit does.
        first = self.submit(ALICE, [{"name": f"x{i}", "command": ["true"]} for i in range(6)], "--hold")
        self.ok(ALICE, "cancel", *map(str, first))
        second = self.submit(ALICE, [{"name": f"y{i}", "command": ["true"]} for i in range(6)], "--hold")
        r = self.gpuq(ALICE, "restart", str(first[0]))
        self.assertEqual(r.returncode, 5, r.stdout + r.stderr)
        self.assertIn(f"{ALICE} has 6 jobs queued or running; restarting 1 more would pass their limit (max_queued 6); "
                      "nothing was restarted", r.stderr)
        self.assertEqual(self.wait(ALICE, [first[0]])[first[0]]["state"], "cancelled")
        # Room for one: one restarts, and a batch of two does not.
        self.ok(ALICE, "cancel", str(second[0]))
        self.ok(ALICE, "restart", str(first[0]))
        r = self.gpuq(ALICE, "restart", str(first[1]), str(first[2]))
        self.assertEqual(r.returncode, 5, r.stdout + r.stderr)
        self.assertIn("restarting 2 more would pass their limit (max_queued 6)", r.stderr)
        self.assertEqual(self.wait(ALICE, [first[0]])[first[0]]["state"], "succeeded")  # it did run again
        self.ok(ALICE, "cancel", *map(str, second[1:]))


if __name__ == "__main__":
    unittest.main()
