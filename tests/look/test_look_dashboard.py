"""`orch dashboard` driven in real headless Chromium over the shared daemon run: the queue lists
every job with its state and why the queued one waits; the preempted-and-resumed job's page draws
one curve vertex per metrics.csv row and marks the preemption and the resume on the step axis;
screenshots are saved as artifacts. A non-loopback bind refuses every request without the token."""

from __future__ import annotations

import csv
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from look_browser import DashboardProcess, dump_dom, find, needs_chromium, parse, path_vertices, screenshot

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dashboard(scenario):
    server = DashboardProcess(scenario["h"].root)
    yield server
    server.close()


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@needs_chromium
def test_queue_lists_every_job_with_its_state_and_why_it_waits(scenario, dashboard, artifacts):
    html = dump_dom(dashboard.url + "#/")
    rows = {int(el.attrs["data-job-id"]): el for el in find(parse(html), "tr") if el.has_class("job-row")}
    states = {job_id: el.attrs["data-state"] for job_id, el in rows.items()}
    assert states == {
        scenario["a"]: "succeeded",
        scenario["b"]: "failed",
        scenario["c"]: "queued",
        scenario["d"]: "succeeded",
    }, states
    assert "held until" in rows[scenario["c"]].text  # why the queued job waits
    assert "diverged" in rows[scenario["b"]].text
    screenshot(dashboard.url + "#/", artifacts / "dashboard-queue.png", size=(1280, 520))


@needs_chromium
def test_job_page_draws_every_metrics_row_and_marks_the_preemption(scenario, dashboard, artifacts):
    h, a = scenario["h"], scenario["a"]
    rows = csv_rows(h.run_dir(a) / "metrics.csv")
    attempts = [x for x in h.store.attempts(a)]
    assert [str(x.outcome) for x in attempts] == ["preempted", "succeeded"], attempts
    preempted_at, resumed_from = attempts[0].step_reached, attempts[1].resumed_from_step

    elements = parse(dump_dom(dashboard.url + f"#/job/{a}"))
    charts = find(elements, id="charts")
    assert charts and int(charts[0].attrs["data-rows"]) == len(rows)
    curves = {el.attrs["data-metric"]: el for el in find(elements, "path") if el.has_class("series")}
    for metric in ("train_loss", "val_loss", "val_acc", "lr", "samples_per_s"):
        expected = sum(1 for r in rows if r.get(metric))
        assert expected > 0, metric
        assert int(curves[metric].attrs["data-points"]) == expected, metric
        assert path_vertices(curves[metric].attrs["d"]) == expected, metric
    # One vertex per row: the train rows and the validation rows together are every row.
    assert int(curves["train_loss"].attrs["data-points"]) + int(curves["val_loss"].attrs["data-points"]) == len(rows)
    marks = [el for el in find(elements, "g") if el.has_class("marker")]
    preemptions = [m for m in marks if m.has_class("marker-preempted")]
    resumes = [m for m in marks if m.has_class("marker-resume")]
    assert preemptions and {m.attrs["data-step"] for m in preemptions} == {str(preempted_at)}
    assert resumes and {m.attrs["data-step"] for m in resumes} == {str(resumed_from)}
    kinds = [el.attrs["data-kind"] for el in find(elements, "tr") if "data-kind" in el.attrs]
    assert "preempted" in kinds and "resumed" in kinds and "succeeded" in kinds
    assert find(elements, "pre", id="log")[0].text.strip()  # the log tail
    links = [el.attrs["href"] for el in find(elements, "a") if el.has_class("prov-file")]
    assert f"/api/job/{a}/provenance/packages.txt" in links and f"/api/job/{a}/provenance/system.json" in links
    screenshot(dashboard.url + f"#/job/{a}", artifacts / "dashboard-job.png", size=(1280, 1500))


@needs_chromium
def test_bill_shows_cost_by_job_idle_and_budget_left(scenario, dashboard, artifacts):
    elements = parse(dump_dom(dashboard.url + "#/bill"))
    bill_rows = {int(el.attrs["data-job-id"]) for el in find(elements, "tr") if "data-job-id" in el.attrs}
    assert {scenario["a"], scenario["b"], scenario["d"]} <= bill_rows
    api = json.loads(urllib.request.urlopen(dashboard.local("/api/bill"), timeout=10).read())
    assert api["budget_total"] == 50.0 and api["budget_left"] == pytest.approx(50.0 - api["total"])
    assert api["total"] > 0 and any(s["name"] == "idle" for s in api["timeline"]["series"])
    text = " ".join(el.text for el in elements if el.tag == "main")
    assert "budget left" in text and "idle" in text
    # the cost chart's legend names each series with what it cost, not its count of points
    legend = " ".join(el.text for el in find(elements, "div") if el.has_class("legend"))
    for series in api["timeline"]["series"]:
        assert f"{series['name']}: " in legend, legend
    assert not re.search(r"\(\d+\)", legend), legend
    # the goodput ledger: one stacked bar per billed job, its parts adding up to the job's cost
    bars = {int(el.attrs["data-job-id"]) for el in find(elements, "div") if el.has_class("stack-row")}
    billed = {j["id"] for j in api["ledger"]["jobs"] if j["billed"] > 0}
    assert billed and bars == billed
    for j in api["ledger"]["jobs"]:
        assert sum(j["money"].values()) == pytest.approx(j["billed"], rel=0.01, abs=1e-6)
    parts = {el.attrs["data-part"] for el in find(elements, "span") if el.has_class("part")}
    assert {"useful", "startup", "eval", "checkpoint"} <= parts
    screenshot(dashboard.url + "#/bill", artifacts / "dashboard-bill.png", size=(1280, 1100))


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_a_non_loopback_bind_refuses_every_request_without_the_token(tmp_path):
    from orchestrator.home.paths import Home
    from orchestrator.store import Store

    home = Home(tmp_path / "home").ensure()
    Store(home.db).close()
    server = DashboardProcess(home.root, host="0.0.0.0")
    try:
        assert server.token and len(server.token) >= 20, server.lines
        assert any("not loopback" in line for line in server.lines)
        for path in ("/", "/api/queue", "/api/bill", "/static/app.js", "/api/job/1"):
            status, _, body = _get(server.local(path))
            assert status == 401, (path, status)
            assert b"token" in body
        assert _get(server.local("/api/queue?token=wrong"))[0] == 401
        assert _get(server.local("/api/queue"), {"Cookie": "orch_dashboard=wrong"})[0] == 401
        status, headers, _ = _get(server.local(f"/?token={server.token}"))
        assert status == 200 and f"orch_dashboard={server.token}" in headers.get("Set-Cookie", "")
        assert _get(server.local("/api/queue"), {"Cookie": f"orch_dashboard={server.token}"})[0] == 200
        assert _get(server.local("/api/queue"), {"Authorization": f"Bearer {server.token}"})[0] == 200
        # Read-only: no method but GET/HEAD, even with the token.
        request = urllib.request.Request(server.local(f"/api/queue?token={server.token}"), data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 405
    finally:
        server.close()


def test_loopback_needs_no_token_but_a_local_host_header(tmp_path):
    from orchestrator.home.paths import Home
    from orchestrator.store import Store

    home = Home(tmp_path / "home").ensure()
    Store(home.db).close()
    server = DashboardProcess(home.root)
    try:
        assert server.token is None
        status, _, body = _get(server.local("/api/queue"))
        assert status == 200 and json.loads(body)["jobs"] == []
        assert _get(server.local("/api/queue"), {"Host": f"localhost:{server.port + 1}"})[0] == 200  # an SSH tunnel
        assert _get(server.local("/api/queue"), {"Host": "evil.example:80"})[0] == 403  # DNS rebinding
    finally:
        server.close()


def test_the_job_page_links_its_provenance_files_served_as_redacted_text(tmp_path):
    from orchestrator.contract import provenance_dir
    from orchestrator.home.paths import Home
    from orchestrator.store import Store

    home = Home(tmp_path / "home").ensure()
    store = Store(home.db)
    job = store.submit(
        name="p", kind="command", gpus=0, priority=0, retries=0, spec={"command": ["x"]}, spec_path="", now=1.0
    )
    store.close()
    folder = provenance_dir(home.run_dir(job.id))
    folder.mkdir(parents=True)
    (folder / "packages.txt").write_text("# python 3.11.7\ntorch==2.13.0\n")
    (folder / "diff.patch").write_text("+url = https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=abcdef0123456789\n")
    server = DashboardProcess(home.root)
    try:
        page = json.loads(_get(server.local(f"/api/job/{job.id}"))[2])
        assert (
            set(page["provenance"]["files"]) == {"packages.txt", "diff.patch"}
            and page["provenance"]["torch"] == "2.13.0"
        )
        status, headers, body = _get(server.local(f"/api/job/{job.id}/provenance/packages.txt"))
        assert (
            status == 200
            and body == b"# python 3.11.7\ntorch==2.13.0\n"
            and headers["Content-Type"].startswith("text/plain")
        )
        status, _, body = _get(server.local(f"/api/job/{job.id}/provenance/diff.patch"))
        assert status == 200 and b"abcdef0123456789" not in body  # a key in the diff is masked, as in events
        assert _get(server.local(f"/api/job/{job.id}/provenance/job.toml"))[0] == 404  # only the provenance files
        assert _get(server.local(f"/api/job/{job.id}/provenance/system.json"))[0] == 404  # not recorded
    finally:
        server.close()
