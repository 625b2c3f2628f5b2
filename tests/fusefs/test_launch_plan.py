"""The launch plan: a launch.toml and flags in, a checked plan (or one clear error) out; the
[env] and [ckpt] tables read by the parts depsnap and hdfs_stripe plug in."""

from __future__ import annotations

import tomllib

import pytest

from depsnap.launch import EnvPlan, parse_env
from fusefs.launch.part import load_parts
from fusefs.launch.plan import LaunchPlan, PartParser, PlanError, merge
from fusefs.launch.plan import plan_from as plan_with
from hdfs_stripe.launch import CkptPlan, parse_ckpt

KEY = "ab" * 32
PARSERS: dict[str, PartParser] = {"env": parse_env, "ckpt": parse_ckpt}


def plan_from(settings: dict[str, object], base_dir: str = ".") -> LaunchPlan:
    return plan_with(settings, base_dir, PARSERS)


def env(plan: LaunchPlan) -> EnvPlan:
    part = plan.parts["env"]
    assert isinstance(part, EnvPlan)
    return part


def ckpt(plan: LaunchPlan) -> CkptPlan:
    part = plan.parts["ckpt"]
    assert isinstance(part, CkptPlan)
    return part
FILE = tomllib.loads("""
image = "registry:5000/train:1"
command = ["python3", "train.py"]

[env]
requirements = "reqs/requirements.txt"
path = "/opt/venv/"

[ckpt]
uris = ["hdfs://nn:9870/ckpt/step-10"]
""")


def test_a_file_becomes_a_plan_with_defaults_and_paths_from_its_directory() -> None:
    plan = plan_from(FILE, "/jobs/a")
    assert plan.image == "registry:5000/train:1"
    assert plan.command == ("python3", "train.py")
    assert plan.runtime == "runc" and not plan.plain_http
    assert env(plan).key is None
    assert env(plan).requirements == "/jobs/a/reqs/requirements.txt"
    assert env(plan).path == "/opt/venv" and env(plan).mode == "restore"
    assert env(plan).install_command() == ["pip", "install", "-r",
                                           "/jobs/a/reqs/requirements.txt"]
    assert ckpt(plan) == CkptPlan(("hdfs://nn:9870/ckpt/step-10",), "/ckpt", True)
    assert ckpt(plan).mounts() == [("hdfs://nn:9870/ckpt/step-10", "/ckpt")]


def test_flags_override_the_file_and_none_means_not_given() -> None:
    flags = {"image": None, "runtime": "bwrap", "command": None,
             "env": {"key": None, "path": "/srv/env", "mode": None},
             "ckpt": {"uris": ["hdfs://nn:9870/a/x", "hdfs://nn:9870/b/y"], "prefetch": False}}
    plan = plan_from(merge(FILE, flags), "/jobs/a")
    assert plan.image == "registry:5000/train:1" and plan.runtime == "bwrap"
    assert env(plan).path == "/srv/env"
    assert not ckpt(plan).prefetch
    assert ckpt(plan).mounts() == [("hdfs://nn:9870/a/x", "/ckpt/x"),
                                   ("hdfs://nn:9870/b/y", "/ckpt/y")]


def test_no_env_and_no_ckpt_tables_mean_the_image_alone() -> None:
    plan = plan_from(merge({"image": "r/i:1"}, {"env": {"key": None}, "ckpt": {"uris": None}}))
    assert plan.parts == {} and plan.command is None


@pytest.mark.parametrize(("settings", "message"), [
    ({}, "image: required"),
    ({"image": "r/i", "imgae": "x"}, "imgae: unknown setting"),
    ({"image": 3}, "image: must be a string"),
    ({"image": "r/i", "runtime": "docker"}, "runtime: 'docker' is not one of runc, bwrap"),
    ({"image": "r/i", "command": "python3 x.py"}, "command: must be a list of strings"),
    ({"image": "r/i", "env": {"key": KEY, "requirements": "r.txt"}}, "exactly one of key"),
    ({"image": "r/i", "env": {"key": "abc"}}, "[env] key: 'abc' is not a snapshot key"),
    ({"image": "r/i", "env": {"mode": "restore"}}, "exactly one of key"),
    ({"image": "r/i", "env": {"key": KEY, "path": "/opt/v"}}, "[env] path: a snapshot"),
    ({"image": "r/i", "env": {"requirements": "r.txt", "mode": "mount"}},
     "mode = \"mount\" needs a key"),
    ({"image": "r/i", "env": {"requirements": "r.txt", "path": "opt/venv"}},
     "[env] path: 'opt/venv' must be an absolute path"),
    ({"image": "r/i", "env": {"requirements": "r.txt", "path": "/"}}, "absolute path below /"),
    ({"image": "r/i", "env": {"requirements": "r.txt", "path": "/a/../b"}}, "without .."),
    ({"image": "r/i", "env": "x"}, "env: must be a table"),
    ({"image": "r/i", "ckpt": {"uris": ["s3://b/k"]}}, "is not an hdfs://HOST:PORT/path URI"),
    ({"image": "r/i", "ckpt": {"uris": ["hdfs://n/a/x", "hdfs://n/b/x"]}}, "same name"),
    ({"image": "r/i", "ckpt": {"uris": ["hdfs://n/a"], "prefetch": "yes"}},
     "[ckpt] prefetch: must be true or false"),
    ({"image": "r/i", "env": {"requirements": "r", "path": "/ckpt/env"},
      "ckpt": {"uris": ["hdfs://n/a"]}}, "overlap"),
])
def test_bad_settings_name_the_setting(settings: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError) as caught:
        plan_from(settings)
    assert message in str(caught.value)


def test_the_installed_parts_are_the_env_and_ckpt_tables_of_depsnap_and_hdfs_stripe() -> None:
    parts = load_parts()
    assert list(parts) == ["ckpt", "env"]
    assert type(parts["env"]).__module__ == "depsnap.launch"
    assert type(parts["ckpt"]).__module__ == "hdfs_stripe.launch"


def test_a_table_no_part_owns_is_an_unknown_setting() -> None:
    with pytest.raises(PlanError, match="ckpt: unknown setting"):
        plan_with({"image": "r/i", "ckpt": {"uris": ["hdfs://n/a"]}}, ".",
                  {"env": parse_env})
