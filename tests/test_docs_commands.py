"""Every command in a ```sh block of README.md, docs/*.md and bench/README.md is checked: a `make`
target exists; a `python -m MODULE ...`, `python SCRIPT.py ...` or `tpu-embedding-pipeline ...`
command's arguments parse with that program's own argparse parser (run up to its parse call, then
stopped: nothing else of it runs); commands of external tools (docker, gcloud, ...) are listed and
left alone. Relative links in those files point at files that exist."""
import argparse
import glob
import os
import re
import runpy
import shlex
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "bench/README.md", *sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))]
EXTERNAL = ("docker", "sudo", "gcloud", "gsutil", "kubectl", "pip", "git", "curl", "tensorboard")


def commands():
    out = []
    for doc in DOCS:
        text = open(os.path.join(REPO, doc), encoding="utf-8").read()
        for block in re.findall(r"```sh\n(.*?)```", text, re.S):
            cmd = ""
            for line in block.splitlines():
                if line.rstrip().endswith("\\"):
                    cmd += line.rstrip()[:-1] + " "
                    continue
                cmd += line
                c = re.split(r"\s+#", cmd)[0].strip()
                cmd = ""
                if c and not c.startswith("#"):
                    out.append((doc, c))
    return out


class _Parsed(Exception):
    pass


def _parse_only(monkeypatch):
    """argparse stops the program right after its top-level parse (errors still exit 2)."""
    depth = [0]

    def stopping(orig, always: bool):
        """`orig`, stopped with _Parsed after the top-level call (`always`: after any call)."""
        def parse(self, args=None, namespace=None):
            depth[0] += 1
            try:
                result = orig(self, args, namespace)
            finally:
                depth[0] -= 1
            if always or depth[0] == 0:
                raise _Parsed(result)
            return result
        return parse

    # parse_args calls parse_known_args (and sub-parsers call it too): only the outermost call stops
    parse_known_args = stopping(argparse.ArgumentParser.parse_known_args, always=False)
    parse_args = stopping(argparse.ArgumentParser.parse_args, always=True)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)


def _run_until_parsed(kind, target, args, monkeypatch):
    monkeypatch.setattr(sys, "argv", [target, *args])
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "entry":
            from pipelines.__main__ import main

            main(args)
        else:
            runpy.run_path(os.path.join(REPO, target), run_name="__main__")
    except _Parsed:
        return
    except SystemExit as e:
        pytest.fail(f"{target} {' '.join(args)}: exits {e.code} while parsing its arguments")
    pytest.fail(f"{target} {' '.join(args)}: finished without parsing arguments with argparse")


MAKE_TARGETS = set(re.findall(r"^([A-Za-z][\w-]*):", open(os.path.join(REPO, "Makefile")).read(), re.M))


@pytest.mark.parametrize("doc, command", commands(), ids=[f"{d}: {c[:60]}" for d, c in commands()])
def test_documented_command(doc, command, monkeypatch):
    words = shlex.split(command)
    if words[0] in EXTERNAL:
        return  # another tool's command: not ours to run
    if words[0] == "make":
        assert words[1] in MAKE_TARGETS, f"{doc}: `{command}`: no target {words[1]!r} in the Makefile"
        return
    monkeypatch.chdir(REPO)
    _parse_only(monkeypatch)
    exe = os.path.basename(words[0])
    if exe == "tpu-embedding-pipeline":
        return _run_until_parsed("entry", "pipelines", words[1:], monkeypatch)
    assert exe in ("python", "python3"), f"{doc}: `{command}`: not a command this test knows; add it to EXTERNAL or fix it"
    if words[1] == "-m":
        return _run_until_parsed("module", words[2], words[3:], monkeypatch)
    assert words[1].endswith(".py") and os.path.exists(os.path.join(REPO, words[1])), f"{doc}: `{command}`: no script {words[1]}"
    _run_until_parsed("script", words[1], words[2:], monkeypatch)


def test_relative_links_point_at_files():
    bad = []
    for doc in DOCS + ["configs/README.md"]:
        text = open(os.path.join(REPO, doc), encoding="utf-8").read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in target or target.startswith(("#", "mailto:")):
                continue
            path = target.split("#")[0]
            if path and not os.path.exists(os.path.normpath(os.path.join(REPO, os.path.dirname(doc), path))):
                bad.append(f"{doc}: {target}")
    assert not bad, bad


def test_readme_is_for_users():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    lines = text.splitlines()
    assert len(lines) < 300
    first = "\n".join(lines[:40])
    assert "make demo" in first and "make test" in first
    assert not re.search(r"\bissue[s]? #?\d+|\b20\d\d-\d\d-\d\d\b", text, re.I)  # no issue numbers, no dates
