"""Job submission against a real private head with the dashboard (free ports, own temp dir,
ended by PID): ``rayflow submit`` and the plain ``ray job submit`` run the jobs unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from rayflow.cli import main
from rayflow.deploy.local import head_processes
from rayflow.deploy.submit import EXCLUDES, build_runtime_env, working_dir_size

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A head from `rayflow cluster up-local`, ended by `down-local` (both by PID)."""
    from rayflow.deploy import local

    state = tmp_path_factory.mktemp("state")
    mp = pytest.MonkeyPatch()
    mp.setattr(local, "STATE_DIR", state)
    mp.setattr(local, "STATE_FILE", state / "head.json")
    r = CliRunner()
    # 6 CPUs: a 4-rank gang leaves room for the tasks that build its input blocks
    up = r.invoke(main, ["cluster", "up-local", "--num-cpus", "6", "--json"])
    assert up.exit_code == 0, up.output
    info = json.loads(up.stdout)
    h = SimpleNamespace(pid=info["pid"], address=info["address"],
                        dashboard_url=info["dashboard"], temp_dir=info["temp_dir"])
    try:
        again = r.invoke(main, ["cluster", "up-local"])
        assert again.exit_code == 1 and "already up" in again.output
        yield h
    finally:
        down = r.invoke(main, ["cluster", "down-local", "--json"])
        mp.undo()
    assert down.exit_code == 0 and json.loads(down.stdout)["stopped_processes"] > 3
    time.sleep(0.5)
    assert head_processes(vars(h)) == [], "the head left processes behind"
    assert not Path(h.temp_dir).exists()


def _last_json(text: str) -> dict:
    """The last top-level JSON object a job printed (its summary)."""
    end = text.rindex("}")
    start = end
    while True:
        start = text.rindex("{", 0, start)
        try:
            return json.loads(text[start:end + 1])
        except ValueError:
            continue


def test_runtime_env_keeps_working_dir_small_and_auth_on(tmp_path):
    env = build_runtime_env(ROOT, extra_excludes=["*.log"], env_vars={"X": "1"})
    assert env["working_dir"] == str(ROOT)
    for pat in (".git", ".venv", "benchmarks/results", "data", "*.png", "*.log"):
        assert pat in env["excludes"]
    assert env["env_vars"] == {"RAY_AUTH_MODE": "token", "X": "1"}
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "pack").write_bytes(b"x" * 10_000)
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "r.json").write_bytes(b"x" * 10_000)
    (tmp_path / "plot.png").write_bytes(b"x" * 10_000)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "a.py").write_bytes(b"x" * 123)
    assert working_dir_size(tmp_path, EXCLUDES) == 123
    assert working_dir_size(ROOT) < 20 * 2**20


@pytest.mark.slow
def test_rayflow_submit_runs_identity_job(head, kafka_broker):
    tag = uuid.uuid4().hex[:8]
    res = CliRunner().invoke(main, [
        "submit", "--address", head.dashboard_url, "--working-dir", str(ROOT), "--json", "--",
        "python", "jobs/identity.py", "--address", "auto", "--bootstrap", kafka_broker.bootstrap,
        "--records", "2000", "--input", f"sub-in-{tag}", "--output", f"sub-out-{tag}"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 0, doc["logs"][-3000:]
    assert doc["status"] == "SUCCEEDED" and doc["exit_code"] == 0
    assert doc["working_dir_bytes"] < 20 * 2**20
    summary = _last_json(doc["logs"])
    assert summary["job"] == "identity"
    assert summary["records"] == 2000 and summary["written"] == 2000
    print(f"submit: accepted in {doc['submit_s']} s, finished in {doc['total_s']} s")


def test_failed_job_returns_its_exit_status_and_sees_a_small_working_dir(head):
    probe = ("import os, sys; print('LS=' + ','.join(sorted(os.listdir('.')))); "
             "print('RES=' + str(os.path.exists('benchmarks/results'))); "
             "print('AUTH=' + os.environ.get('RAY_AUTH_MODE', '')); "
             # the head's ray.inline_bytes: a half-megabyte result stays out of the store
             "import ray, numpy as np; ray.init(); "
             "ref = ray.remote(lambda: np.zeros(500_000, np.uint8)).remote(); ray.get(ref); "
             "print('STORED=' + str(ray.experimental.get_object_locations([ref])[ref]"
             "['node_ids'])); sys.exit(3)")
    res = CliRunner().invoke(main, ["submit", "--address", head.dashboard_url, "--working-dir",
                                    str(ROOT), "--json", "--", "python", "-c", probe])
    assert res.exit_code == 3
    doc = json.loads(res.stdout)
    assert doc["status"] == "FAILED" and doc["exit_code"] == 3
    listing = next(ln for ln in doc["logs"].splitlines() if ln.startswith("LS="))[3:].split(",")
    assert "jobs" in listing and "rayflow" in listing
    assert ".git" not in listing and ".venv" not in listing and "data" not in listing
    assert "RES=False" in doc["logs"] and "AUTH=token" in doc["logs"]
    assert "STORED=[]" in doc["logs"], doc["logs"][-3000:]


def test_submit_to_nowhere_is_one_line_error():
    res = CliRunner().invoke(main, ["submit", "--address", "http://127.0.0.1:9", "--",
                                    "python", "-c", "pass"])
    assert res.exit_code == 1
    assert res.output.startswith("error: cannot reach the Ray job API at http://127.0.0.1:9")
    assert "hint:" in res.output and "Traceback" not in res.output


# Every job in jobs/, unchanged, through the plain `ray job submit` CLI (small sizes).
JOBS = {
    "identity": ["--records", "1000"],
    "sleep": ["--records", "400", "--partitions", "2", "--parallelism", "2"],
    "wordcount": ["--records", "500"],
    "cannon": ["--n", "256", "--grid", "2", "--check"],
    "cg": ["--n", "256", "--ranks", "2"],
    "image_blur": ["--count", "8", "--size", "64", "--no-memory"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(JOBS))
def test_ray_job_submit_runs_every_job(head, kafka_broker, name):
    args = ["python", f"jobs/{name}.py", "--address", "auto", *JOBS[name]]
    if name in ("identity", "sleep", "wordcount"):
        tag = uuid.uuid4().hex[:8]
        args += ["--bootstrap", kafka_broker.bootstrap, "--input", f"{name}-in-{tag}",
                 "--output", f"{name}-out-{tag}"]
    ray_cli = str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    t0 = time.time()
    proc = subprocess.run([ray_cli, "job", "submit", "--address", head.dashboard_url,
                           "--working-dir", str(ROOT), "--", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "succeeded" in out
    print(f"ray job submit {name}: {time.time() - t0:.1f} s")


# An unmodified mpi4py program on a cluster: from outside it by address (a laptop's case) and
# inside a job under the plain `ray job submit`, with the ranks' output checked.
CPI = "tests/hpc/mpi_programs/cpi.py"


def _cpi_pi(out: str) -> float:
    lines = [ln for ln in out.splitlines() if "[0] pi " in ln]
    assert len(lines) == 1, out[-3000:]
    return float(lines[0].split()[-1])


def _cpi_reference(n: int) -> float:
    h = 1.0 / n
    return h * sum(4.0 / (1.0 + (h * (i + 0.5)) ** 2) for i in range(n))


@pytest.mark.slow
def test_rayflow_mpirun_against_a_cluster_by_address(head):
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    proc = subprocess.run([sys.executable, "-m", "rayflow", "mpirun", "-n", "3", "--address",
                           head.address, "--rank-cpus", "0.5", "--", "python", CPI, "3000"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert _cpi_pi(proc.stdout) == pytest.approx(_cpi_reference(3000), rel=1e-14)


@pytest.mark.slow
def test_rayflow_mpirun_under_ray_job_submit(head):
    ray_cli = str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    proc = subprocess.run([ray_cli, "job", "submit", "--address", head.dashboard_url,
                           "--working-dir", str(ROOT), "--", "python", "-m", "rayflow", "mpirun",
                           "-n", "2", "--address", "auto", "--rank-cpus", "0.5", "--", "python",
                           CPI, "2000"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "succeeded" in out
    assert _cpi_pi(proc.stdout) == pytest.approx(_cpi_reference(2000), rel=1e-14)


# -- without a cluster: the connection check, log following and Ctrl-C ------------------------
@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers (read nothing, write nothing)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def test_submit_to_a_port_that_never_answers_times_out_and_says_so(silent_port):
    t0 = time.monotonic()
    res = CliRunner().invoke(main, ["submit", "--address", f"http://127.0.0.1:{silent_port}",
                                    "--connect-timeout", "0.5", "--", "python", "-c", "pass"])
    assert time.monotonic() - t0 < 60  # a generous bound on what used to hang forever
    assert res.exit_code == 1
    assert res.output.splitlines()[0] == (
        f"error: the Ray job API at http://127.0.0.1:{silent_port} accepted the connection "
        f"but sent no answer within 0.5 s: is this the Ray dashboard's port (8265 by "
        f"default)?")


class _FakeClient:
    """The parts of JobSubmissionClient that submit() uses, scripted."""

    def __init__(self, chunks, interrupt_after=None):
        self.chunks, self.interrupt_after = chunks, interrupt_after
        self.stopped, self.log_downloads, self.submitted = [], 0, {}

    def submit_job(self, **kw):
        self.submitted = kw
        return kw.get("submission_id") or "raysubmit_1"

    async def tail_job_logs(self, job_id):
        for n, c in enumerate(self.chunks):
            if self.interrupt_after is not None and n == self.interrupt_after:
                raise KeyboardInterrupt
            yield c

    def get_job_status(self, job_id):
        from ray.job_submission import JobStatus

        return JobStatus.SUCCEEDED

    def get_job_info(self, job_id):
        from ray.job_submission import JobStatus

        return SimpleNamespace(status=JobStatus.SUCCEEDED, driver_exit_code=0, message="")

    def get_job_logs(self, job_id):
        self.log_downloads += 1
        return "".join(self.chunks)

    def stop_job(self, job_id):
        self.stopped.append(job_id)


def test_submit_tails_the_log_once_and_passes_ray_job_submit_options(monkeypatch):
    from rayflow.deploy import submit as sub

    fake = _FakeClient(["line 1\n", "line 2\n", "done\n"])
    monkeypatch.setattr(sub, "_client", lambda address, timeout: fake)
    res = CliRunner().invoke(main, [
        "submit", "--address", "http://x:1", "--no-working-dir", "--submission-id", "my-job",
        "--entrypoint-num-cpus", "0.5", "--runtime-env-json", '{"env_vars": {"A": "1"}}',
        "--", "python", "-c", "pass"])
    assert res.exit_code == 0, res.output
    assert res.stdout == "line 1\nline 2\ndone\n"   # each chunk once, as it came
    assert fake.log_downloads == 0                  # never the whole log again
    assert fake.submitted["submission_id"] == "my-job"
    assert fake.submitted["entrypoint_num_cpus"] == 0.5
    assert fake.submitted["runtime_env"]["env_vars"] == {"RAY_AUTH_MODE": "token", "A": "1"}


def test_runtime_env_file_and_json_exclude_each_other(tmp_path, monkeypatch):
    from rayflow.deploy import submit as sub

    fake = _FakeClient(["ok\n"])
    monkeypatch.setattr(sub, "_client", lambda address, timeout: fake)
    f = tmp_path / "env.yaml"
    f.write_text("pip: [tqdm]\nworking_dir: " + str(tmp_path) + "\n")
    res = CliRunner().invoke(main, ["submit", "--address", "http://x:1", "--runtime-env", str(f),
                                    "--", "python", "-c", "pass"])
    assert res.exit_code == 0, res.output
    env = fake.submitted["runtime_env"]
    assert env["pip"] == ["tqdm"] and env["working_dir"] == str(tmp_path)  # theirs: no flag
    both = CliRunner().invoke(main, ["submit", "--runtime-env", str(f), "--runtime-env-json",
                                     "{}", "--", "true"])
    assert both.exit_code == 2 and "not both" in both.output
    bad = CliRunner().invoke(main, ["submit", "--runtime-env-json", "[1", "--", "true"])
    assert bad.exit_code == 1 and "error: --runtime-env-json: not valid JSON" in bad.output


def test_ctrl_c_detaches_and_leaves_the_job_running(monkeypatch):
    from rayflow.deploy import submit as sub

    fake = _FakeClient(["a\n", "b\n"], interrupt_after=1)
    monkeypatch.setattr(sub, "_client", lambda address, timeout: fake)
    res = CliRunner().invoke(main, ["submit", "--address", "http://x:1", "--no-working-dir",
                                    "--", "python", "-c", "pass"])
    assert res.exit_code == 130
    assert fake.stopped == []
    assert "detached from job raysubmit_1; it keeps running" in res.stderr
    assert "ray job stop raysubmit_1" in res.stderr


def test_submit_waits_for_a_job_agent_that_is_still_starting(monkeypatch):
    """A cluster that answers but whose job agent is not up yet (Ray's HTTP 500 "No available
    agent to submit job, please try again later", seen under load right after `ray start`)
    gets more time than a connection: submit retries past the connect timeout."""
    from rayflow.deploy import submit as sub

    calls = []

    class StartingAgent:  # the job API's answers while the agent starts: 500, 500, 500, ok
        def submit_job(self, **kw):
            calls.append(kw)
            if len(calls) < 4:
                raise RuntimeError("Request failed with status code 500: No available agent "
                                   "to submit job, please try again later..")
            return "raysubmit_1"

        def get_job_status(self, job_id):
            return "PENDING"

    clock = iter(range(0, 1000, 5))  # each look at the clock: 5 s later
    monkeypatch.setattr(sub, "_client", lambda address, timeout: StartingAgent())
    monkeypatch.setattr(sub.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(sub.time, "sleep", lambda s: None)
    got = sub.submit(["python", "-c", "pass"], address="http://127.0.0.1:1", working_dir=None,
                     wait=False, connect_timeout_s=1.0)
    assert got.job_id == "raysubmit_1" and len(calls) == 4
    clock = iter(range(0, 1000, 30))  # an agent that never comes: the error, after the wait
    monkeypatch.setattr(sub.time, "monotonic", lambda: float(next(clock)))
    calls.clear()
    StartingAgent.submit_job = lambda self, **kw: (_ for _ in ()).throw(  # type: ignore
        RuntimeError("No available agent to submit job"))
    with pytest.raises(RuntimeError, match="No available agent"):
        sub.submit(["python", "-c", "pass"], address="http://127.0.0.1:1", working_dir=None,
                   wait=False, connect_timeout_s=1.0)
