"""The model registry at the push destination (components/model_registry/registry.py): what the
lookup finds in every state a destination can be in, one table of cases; the push order that keeps
a failed push from being trusted; the refusals, each naming the path and the way out."""
import json
import os

import pytest

from components.model_registry import registry

T0 = 1_764_000_000  # a push time (seconds)


def _model(path, complete=True):
    """A stand-in SavedModel directory: the lookup reads only file names."""
    os.makedirs(os.path.join(path, "variables"), exist_ok=True)
    with open(os.path.join(path, "variables", "variables.index"), "w") as fh:
        fh.write("x")
    if complete:
        with open(os.path.join(path, "saved_model.pb"), "w") as fh:
            fh.write("pb")
    return str(path)


def _fields(tmp, name, auc=0.8):
    trainer = os.path.join(str(tmp), "trainer", name)
    os.makedirs(trainer, exist_ok=True)
    return {"pipeline": "p", "run": {"id": f"run-{name}"}, "trainer_model": trainer, "eval_auc": auc,
            "exported_model": os.path.join(str(tmp), "exported", name)}


def _push(tmp, dest, name, now, auc=0.8):
    return registry.push(_model(os.path.join(str(tmp), "src", name)), str(dest), _fields(tmp, name, auc), now=now)


def _rm(path):
    import shutil

    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


# Each case: a function that builds the destination's state (returns nothing), the version found
# (None: none), whether it warm-starts, and the reasons of the skipped paths (substrings).
def _nothing(tmp, dest):
    pass


def _empty_dir(tmp, dest):
    os.makedirs(dest)


def _one(tmp, dest):
    _push(tmp, dest, "a", T0)


def _two(tmp, dest):
    _push(tmp, dest, "a", T0)
    _push(tmp, dest, "b", T0 + 60)


def _newest_deleted(tmp, dest):
    _two(tmp, dest)
    _rm(os.path.join(dest, str(T0 + 60)))


def _newest_unfinished(tmp, dest):
    _two(tmp, dest)
    os.remove(os.path.join(dest, str(T0 + 60), "saved_model.pb"))  # the push stopped before its last file


def _unfinished_without_entry(tmp, dest):
    _one(tmp, dest)
    _model(os.path.join(dest, str(T0 + 5)), complete=False)


def _trainer_gone(tmp, dest):
    entry = _push(tmp, dest, "a", T0)
    _rm(entry["trainer_model"])


def _all_deleted(tmp, dest):
    _two(tmp, dest)
    _rm(os.path.join(dest, str(T0)))
    _rm(os.path.join(dest, str(T0 + 60)))


def _older_history_deleted(tmp, dest):
    _two(tmp, dest)
    _rm(os.path.join(dest, str(T0)))  # an old version cleaned up: history, not a reason to skip


LOOKUP_CASES = [
    ("no destination yet", _nothing, None, False, []),
    ("empty destination", _empty_dir, None, False, []),
    ("one push", _one, T0, True, []),
    ("two pushes: the newest", _two, T0 + 60, True, []),
    ("newest version deleted: the one before", _newest_deleted, T0, True, ["model directory was deleted"]),
    ("newest push did not finish: the one before", _newest_unfinished, T0, True, ["did not finish"]),
    ("unfinished version without entry: skipped", _unfinished_without_entry, T0, True, ["did not finish"]),
    ("trainer model gone: found, no warm start", _trainer_gone, T0, False, []),
    ("every version deleted: nothing", _all_deleted, None, False, ["deleted", "deleted"]),
    ("an old version cleaned up", _older_history_deleted, T0 + 60, True, []),
]


@pytest.mark.parametrize("name, build, version, warm, skipped", LOOKUP_CASES, ids=[c[0] for c in LOOKUP_CASES])
def test_lookup(tmp_path, name, build, version, warm, skipped):
    dest = str(tmp_path / "serving")
    build(tmp_path, dest)
    found = registry.lookup(dest)
    assert found.found is (version is not None)
    assert len(found.skipped) == len(skipped)
    assert all(want in got["reason"] for want, got in zip(skipped, found.skipped)), found.skipped
    if version is None:
        assert found.served_model is None and found.entry is None and found.warm_start_model is None
        assert "nothing to compare with" in found.note
        return
    assert found.version == str(version) and found.served_model == os.path.join(dest, str(version))
    assert found.entry["version"] == str(version) and found.entry["serving_model"] == found.served_model
    assert (found.warm_start_model == found.entry["trainer_model"]) if warm else found.warm_start_model is None
    if not warm:
        assert found.entry["trainer_model"] in found.warm_start_note and "trained from scratch" in found.warm_start_note
    # what the LastBlessedModel artifact carries to the Trainer and the exporter, both ways
    registry.write_lookup(str(tmp_path / "artifact"), found)
    assert registry.read_lookup(str(tmp_path / "artifact" / "Format-Serving")).to_dict() == found.to_dict()


def _unregistered(tmp, dest):
    """A version TF Serving serves that no registry entry describes (TFX's stock Pusher, a copy by hand)."""
    _model(os.path.join(dest, str(T0)))


def _unregistered_newest(tmp, dest):
    _one(tmp, dest)
    _model(os.path.join(dest, str(T0 + 60)))


def _edit_entry(edit):
    def build(tmp, dest):
        _one(tmp, dest)
        path = registry.entry_path(dest, str(T0))
        with open(path) as fh:
            text = fh.read()
        with open(path, "w") as fh:
            fh.write(edit(text))
    return build


REFUSAL_CASES = [
    ("served but unregistered, no registry at all", _unregistered, "has no registry entry"),
    ("newest served version unregistered", _unregistered_newest, "has no registry entry"),
    ("half-written entry", _edit_entry(lambda t: t[: len(t) // 2]), "not valid JSON"),
    ("entry without its AUC", _edit_entry(lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "eval_auc"})),
     "incomplete registry entry, missing eval_auc"),
    ("entry of another format", _edit_entry(lambda t: json.dumps(dict(json.loads(t), format=2))), "format 2"),
    ("entry naming another version", _edit_entry(lambda t: json.dumps(dict(json.loads(t), version="7"))),
     "says version '7'"),
    ("entry that is no object", _edit_entry(lambda t: "[1, 2]"), "not a registry entry"),
    ("entry whose run is no object", _edit_entry(lambda t: json.dumps(dict(json.loads(t), run="r1"))),
     "run is 'r1', not an object"),
    ("entry whose AUC is no number", _edit_entry(lambda t: json.dumps(dict(json.loads(t), eval_auc="0.8"))),
     "eval_auc is '0.8', not a number"),
    ("entry without a Trainer model path", _edit_entry(lambda t: json.dumps(dict(json.loads(t), trainer_model=None))),
     "trainer_model is None, not a path"),
]


@pytest.mark.parametrize("name, build, message", REFUSAL_CASES, ids=[c[0] for c in REFUSAL_CASES])
def test_lookup_refuses_a_served_model_it_cannot_describe(tmp_path, name, build, message):
    dest = str(tmp_path / "serving")
    build(tmp_path, dest)
    with pytest.raises(registry.RegistryError) as e:
        registry.lookup(dest)
    text = str(e.value)
    assert message in text and "\n" not in text
    served = os.path.join(dest, str(max(registry.versions(dest))))
    # one line naming the served version and its entry, and the way out
    assert served in text and registry.entry_path(dest, os.path.basename(served)) in text
    assert f"delete {served}" in text and "kubeflow.serving_dir" in text


def test_push_versions_are_new_even_within_one_second(tmp_path):
    dest = tmp_path / "serving"
    first = _push(tmp_path, dest, "a", T0)
    second = _push(tmp_path, dest, "b", T0)  # TFX's Pusher would skip this copy and report it pushed
    assert (int(first["version"]), int(second["version"])) == (T0, T0 + 1)
    assert registry.lookup(str(dest)).entry["run"] == {"id": "run-b"}
    assert registry.next_version(str(dest), now=T0 - 100) == T0 + 2  # a clock behind the last push
    # entries are written whole: no temporary file is left beside them
    assert sorted(os.listdir(registry.registry_dir(str(dest)))) == [f"{T0}.json", f"{T0 + 1}.json"]


def test_a_push_that_fails_before_its_last_file_is_taken_back_out(tmp_path, monkeypatch):
    """The entry goes in before saved_model.pb: a push that fails between them (the last file cut,
    the disk full) takes its entry and its version directory back out, so no version it began is
    registered and the model before it is still the one served and compared with."""
    from tfx.dsl.io import fileio

    dest = str(tmp_path / "serving")
    _push(tmp_path, dest, "a", T0)
    copy = fileio.copy

    def cut(src, dst, overwrite=False):
        if os.path.basename(src) == "saved_model.pb":  # half of it arrives, then the disk is full
            with open(dst, "w") as fh:
                fh.write("p")
            raise OSError(28, f"No space left on device while copying {src}")
        return copy(src, dst, overwrite)

    monkeypatch.setattr(fileio, "copy", cut)
    with pytest.raises(OSError, match="saved_model.pb"):
        _push(tmp_path, dest, "b", T0 + 60)
    monkeypatch.undo()
    assert not os.path.exists(registry.entry_path(dest, str(T0 + 60)))
    assert not os.path.exists(os.path.join(dest, str(T0 + 60)))
    found = registry.lookup(dest)
    assert found.version == str(T0) and found.skipped == [] and registry.versions(dest) == [T0]
    assert _push(tmp_path, dest, "c", T0 + 60)["version"] == str(T0 + 60)
    assert registry.lookup(dest).version == str(T0 + 60)


def test_a_push_killed_before_its_last_file_is_never_trusted(tmp_path):
    """A process killed between the entry and saved_model.pb cannot take itself back out: it leaves a
    version TF Serving cannot load, which the lookup skips with its reason; the next push gets a
    version after it."""
    dest = str(tmp_path / "serving")
    _push(tmp_path, dest, "a", T0)
    _push(tmp_path, dest, "b", T0 + 60)
    os.remove(os.path.join(dest, str(T0 + 60), "saved_model.pb"))  # what a kill before the last rename leaves
    found = registry.lookup(dest)
    assert found.version == str(T0) and "did not finish" in found.skipped[0]["reason"]
    assert _push(tmp_path, dest, "c", T0 + 60)["version"] == str(T0 + 61)
    assert registry.lookup(dest).version == str(T0 + 61)


def test_push_refuses_a_model_without_saved_model_pb(tmp_path):
    src = _model(tmp_path / "src" / "x", complete=False)
    with pytest.raises(registry.RegistryError, match="no saved_model.pb; nothing to push"):
        registry.push(src, str(tmp_path / "serving"), _fields(tmp_path, "x"), now=T0)
    assert not os.path.exists(tmp_path / "serving")


def test_history_lists_every_version_with_its_state(tmp_path):
    dest = str(tmp_path / "serving")
    _newest_unfinished(tmp_path, dest)
    _push(tmp_path, dest, "c", T0 + 120)
    _rm(os.path.join(dest, str(T0 + 120)))
    rows = registry.history(dest)
    assert [(r["version"], r["state"]) for r in rows] == [
        (T0 + 120, "deleted"), (T0 + 60, "unfinished"), (T0, "served")]
    assert all("entry" in r for r in rows)


def test_cli_says_what_is_served_and_what_the_next_run_finds(tmp_path, capsys):
    from components.model_registry.__main__ import main

    dest = str(tmp_path / "serving")
    _newest_unfinished(tmp_path, dest)
    assert main([dest]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:3] == [str(T0 + 60), "unfinished", "0.8000"]
    assert out[2].split()[:3] == [str(T0), "served", "0.8000"] and out[2].split()[-1] == "run-a"
    assert f"next run compares with: {os.path.join(dest, str(T0))}" in out[3]
    assert out[4].startswith("next run warm-starts from: ") and out[5].startswith("skipped: ")
    _unregistered_newest(tmp_path, str(tmp_path / "other"))
    assert main([str(tmp_path / "other")]) == 2
    assert "error: the next run stops here: " in capsys.readouterr().err


def test_a_version_name_the_registry_cannot_read_is_refused(tmp_path):
    """TF Serving reads `0042` as version 42; the registry would look for `42`: refused, named."""
    dest = str(tmp_path / "serving")
    _one(tmp_path, dest)
    _model(os.path.join(dest, "0042"))
    with pytest.raises(registry.RegistryError, match=r"0042: TF Serving reads such names as versions.*without leading zeros"):
        registry.lookup(dest)
    os.rename(os.path.join(dest, "0042"), os.path.join(dest, "٤٢"))  # not ASCII digits: no version for TF Serving either
    assert registry.lookup(dest).version == str(T0)


def test_a_version_another_push_created_meanwhile_is_not_copied_into(tmp_path, monkeypatch):
    dest = str(tmp_path / "serving")
    _push(tmp_path, dest, "a", T0)
    real = registry.next_version

    def racing(serving_dir, now=None):
        v = real(serving_dir, now)  # another push creates this version between the choice and the copy
        os.makedirs(os.path.join(serving_dir, str(v)))
        return v

    monkeypatch.setattr(registry, "next_version", racing)
    with pytest.raises(registry.RegistryError, match=f"{T0 + 1} appeared while this push chose it: another push is under way"):
        _push(tmp_path, dest, "b", T0)
    assert os.listdir(os.path.join(dest, str(T0 + 1))) == [] and registry.entry_versions(dest) == [T0]
