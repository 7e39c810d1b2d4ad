"""Where a several-rank job's launcher gets its shape: flags, else Slurm's variables; and the sbatch example."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from appliance.cli.launch import topology
from appliance.ranks import LaunchError
from appliance.cli.main import build_parser
from appliance.config.job_file import parse_job_text

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "examples" / "slurm" / "train-2nodes.sbatch"


def spec(resources: str):
    return parse_job_text(f"name: j\nstudent: {{model: m}}\nrewards: [{{name: correctness}}]\nresources: {resources}\n")


def args(*flags: str):
    return build_parser().parse_args(["train", "job.yaml", *flags])


def test_flags_give_the_shape_of_a_two_box_job():
    shape = topology(
        args("--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "10.0.0.1:29400"), spec("{gpus: 4, nodes: 2}"), {}
    )
    assert (shape.nnodes, shape.node_rank, shape.endpoint, shape.nproc_per_node) == (2, 1, "10.0.0.1:29400", 4)


def test_slurm_variables_stand_in_for_the_flags():
    environ = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "MASTER_ADDR": "head", "MASTER_PORT": "29500"}
    shape = topology(args(), spec("{gpus: 2, nodes: 2}"), environ)
    assert (shape.nnodes, shape.node_rank, shape.endpoint) == (2, 1, "head:29500")


def test_one_box_needs_no_rendezvous_flags():
    shape = topology(args(), spec("{gpus: 2}"), {})
    assert (shape.nnodes, shape.node_rank, shape.endpoint, shape.nproc_per_node) == (1, None, None, 2)


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--nnodes", "2", "--node-rank", "0"), "needs --rdzv-endpoint"),
        (("--nnodes", "2", "--rdzv-endpoint", "h:1"), "needs --node-rank"),
        (("--nnodes", "3", "--node-rank", "0", "--rdzv-endpoint", "h:1"), "resources.nodes is 2"),
        (("--nnodes", "2", "--node-rank", "-1", "--rdzv-endpoint", "h:1"), "outside 0..1"),
    ],
)
def test_an_incomplete_or_inconsistent_launch_is_refused(flags, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        topology(args(*flags), spec("{gpus: 1, nodes: 2}"), {})


def test_the_sbatch_example_runs_a_command_the_cli_accepts_for_its_job_file():
    text = SBATCH.read_text()
    nodes = int(re.search(r"#SBATCH --nodes=(\d+)", text).group(1))
    command = re.search(r'srun bash -c "(.*?)"', text, re.S).group(1).replace("\\\n", " ")
    words = shlex.split(command.replace("\\$", "$"))
    assert words[:2] == ["appliance", "train"]
    values = {"$JOB_FILE": "examples/multiply-2nodes.yaml", "$DATA_DIR": "/d", "$SLURM_NNODES": str(nodes)}
    values.update({"$SLURM_NODEID": "1", "$HEAD:$PORT": "head:29400"})
    parsed = build_parser().parse_args([values.get(word, word) for word in words[1:]])
    assert (parsed.nnodes, parsed.node_rank, parsed.rdzv_endpoint) == (nodes, 1, "head:29400")
    example = yaml.safe_load((ROOT / "examples" / "multiply-2nodes.yaml").read_text())
    assert example["resources"]["nodes"] == nodes
