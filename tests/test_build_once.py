"""What a process or a machine builds once and then shares: the default tiny tokenizer (trained once into the user's
cache), a simulated server's tokenizer (loaded once per folder), the certificate store under every client; and the
CA store a simulated server does not load at all."""

from __future__ import annotations

import asyncio
import filecmp
import json
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from draftgen.client.server import ServerClient
from draftgen.sim.tokenizer import SimTokenizer, TokenizerFolderError, default_tokenizer
from draftgen.training.local_tokenizer import build_tiny_tokenizer, cached_tiny_tokenizer

BUILT_FILES = ("tokenizer.json", "tokenizer_config.json")


def test_the_tiny_tokenizer_is_trained_once_into_the_cache_and_equals_a_fresh_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTGEN_CACHE", str(tmp_path / "cache"))
    first = cached_tiny_tokenizer()
    assert first.parent == tmp_path / "cache"
    stamp = (first / "tokenizer.json").stat().st_mtime_ns
    assert (
        cached_tiny_tokenizer() == first and (first / "tokenizer.json").stat().st_mtime_ns == stamp
    )  # not again
    fresh = build_tiny_tokenizer(tmp_path / "fresh")
    assert all(filecmp.cmp(first / name, fresh / name, shallow=False) for name in BUILT_FILES)
    assert cached_tiny_tokenizer(vocab_size=1024) != first  # built from other inputs: another folder
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")] == []  # no staging left
    # a folder asked for gets a copy; the server's default reads the cached one in place
    copy = default_tokenizer(tmp_path / "fleet" / "tokenizer")
    assert all(filecmp.cmp(first / name, copy / name, shallow=False) for name in BUILT_FILES)
    assert default_tokenizer() == first


def test_servers_starting_at_once_share_one_whole_folder(tmp_path: Path) -> None:
    """Four processes ask for the tokenizer at once with an empty cache: each gets the same whole folder."""
    script = (
        "from draftgen.training.local_tokenizer import cached_tiny_tokenizer; print(cached_tiny_tokenizer())"
    )
    env = {"DRAFTGEN_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(4)
    ]
    folders = {proc.communicate(timeout=120)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert len(folders) == 1
    folder = Path(folders.pop())
    assert json.loads((folder / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"
    SimTokenizer(folder)  # loads whole
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [folder.name]


def test_an_unwritable_cache_still_gives_a_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DRAFTGEN_CACHE", str(blocker / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    folder = cached_tiny_tokenizer()
    assert folder.parent == tmp_path / "tmp" and (folder / "tokenizer.json").is_file()


def test_a_server_loads_its_folder_once_and_again_when_the_files_change(tmp_path: Path) -> None:
    folder = build_tiny_tokenizer(tmp_path / "tok")
    first = SimTokenizer.load(folder)
    assert SimTokenizer.load(folder) is first
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["eos_token"] = "no-such-token"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerFolderError, match="no-such-token"):
        SimTokenizer.load(folder)  # changed files are read again, never the copy loaded before


def test_every_client_shares_one_certificate_store_that_still_verifies() -> None:
    clients = [ServerClient(f"https://127.0.0.1:{port}") for port in (1, 2)]
    try:
        contexts = {id(client.transport.http._transport.ssl_context) for client in clients}  # type: ignore[attr-defined]
        assert len(contexts) == 1
        context = clients[0].transport.http._transport.ssl_context  # type: ignore[attr-defined]
        assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
        assert context.cert_store_stats()["x509_ca"] > 0  # the system's certificates, loaded once
    finally:
        for client in clients:
            asyncio.run(client.close())


def test_a_fleets_servers_load_no_ca_store_and_still_serve(instant_fleet) -> None:
    """A simulated server opens no TLS connection: its fleet points it at an empty CA store, so aiohttp's import
    does not load the system's at every start (sim.defaults.NO_CA_STORE); it answers as ever."""
    import psutil

    from draftgen.sim.defaults import NO_CA_STORE

    fleet = instant_fleet(1)
    port = fleet.urls[0].rsplit(":", 1)[1]
    (server,) = [p for p in psutil.Process().children(recursive=True) if port in p.cmdline()]
    environ = server.environ()
    assert (
        {key: environ.get(key) for key in NO_CA_STORE}
        == NO_CA_STORE
        == {
            "SSL_CERT_FILE": "/dev/null",
            "SSL_CERT_DIR": "/dev/null",
        }
    )
    with urllib.request.urlopen(f"{fleet.urls[0]}/v1/models", timeout=10) as response:
        assert response.status == 200
