"""Prompt sets fetched where none is saved (fewerpasses/core/prompts.py: FETCHED): a pinned
URL, its SHA-256 checked before anything is written, a saved local copy always first, and
offline a clear error naming both."""

import hashlib
import http.server
import re
import shutil
import socket
import threading

import pytest

from fewerpasses.core.prompts import FETCHED, FetchedSet, fetch_prompt_set
from workflow import REPO, copy_workflow, planned_jobs, snakemake, write_config

BODY = b'{"question_id": 1, "category": "qa", "turns": ["What is the capital of France?"]}\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real HTTP server on loopback, serving one file."""
    root = tmp_path_factory.mktemp("served")
    (root / "question.jsonl").write_bytes(BODY)
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/question.jsonl"
    httpd.shutdown()


def test_a_fetched_set_is_written_only_when_its_hash_matches(server, tmp_path):
    good = FetchedSet("qs", server, hashlib.sha256(BODY).hexdigest())
    out = fetch_prompt_set(good, tmp_path / "qs.jsonl", "config/prompts/qs.jsonl")
    assert out.read_bytes() == BODY
    bad = FetchedSet("qs", server, "0" * 64)
    with pytest.raises(RuntimeError, match=f"{re.escape(server)} has SHA-256 {hashlib.sha256(BODY).hexdigest()}"):
        fetch_prompt_set(bad, tmp_path / "other.jsonl", "config/prompts/qs.jsonl")
    assert not (tmp_path / "other.jsonl").exists()


def test_offline_the_error_names_the_local_file_and_the_url(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    closed = FetchedSet("qs", f"http://127.0.0.1:{port}/question.jsonl", "0" * 64)
    with pytest.raises(RuntimeError) as e:
        fetch_prompt_set(closed, tmp_path / "qs.jsonl", "config/prompts/qs.jsonl", timeout=5)
    assert "no local file config/prompts/qs.jsonl" in str(e.value) and closed.url in str(e.value)


def test_spec_bench_is_pinned_to_a_commit_and_a_hash():
    sb = FETCHED["spec_bench"]
    assert re.search(r"/hemingkx/Spec-Bench/[0-9a-f]{40}/data/spec_bench/question\.jsonl$", sb.url)
    assert re.fullmatch(r"[0-9a-f]{64}", sb.sha256)


@pytest.mark.slow
def test_the_fetch_runs_before_the_cells_and_a_saved_copy_replaces_it(tmp_path):
    copy_workflow(tmp_path)
    cfg = {
        "models": {"m": {"source": str(REPO / "models" / "stdlib-llama-3l")}},
        "generation": {"max_tokens": 4, "repeats": 1, "prompt_set": "spec_bench", "per_category": 1},
        "lookup": {"models": ["m"], "max_ngrams": [3], "draft_lengths": [2]},
    }
    write_config(tmp_path, cfg)
    assert planned_jobs(tmp_path)["fetch_prompt_set"] == 1
    # Offline here: the fetch fails, naming both, and no cell has run.
    proc = snakemake(tmp_path, "--cores", "1", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "fetch_prompt_set" in out
    log = (tmp_path / "logs/prompts/spec_bench.fetch.log").read_text()
    assert "config/prompts/spec_bench.jsonl" in log and FETCHED["spec_bench"].url in log
    assert not (tmp_path / "results/lookup").exists()
    # A saved copy is used first: no fetch is planned.
    shutil.copy(REPO / "config/prompts/categories.yaml", tmp_path / "config/prompts/spec_bench.yaml")
    assert "fetch_prompt_set" not in planned_jobs(tmp_path)
