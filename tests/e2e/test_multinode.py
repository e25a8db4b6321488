"""A real two-node Ray cluster on this machine (a head and a second raylet, each its own processes and 1 CPU):
the tiny recipe with trainer.nnodes=2 places one rank per node, trains, saves, and resumes through it, and the
joined cluster is left running."""

import json
import os
import re

import pytest
import ray
from e2e_utils import tiny_cfg
from ray.cluster_utils import Cluster

from rlcore.controller.placement import ResourcePool
from rlcore.train import run

pytestmark = pytest.mark.slow

MAP_LINE = re.compile(r"^  node (\d) ([0-9a-f]{8}) @ (\S+)( \(driver\))?: (.*)$")


@pytest.fixture(scope="module")
def two_nodes():
    from conftest import close_shared_ray

    close_shared_ray()  # run() would join it rather than the address it is given
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def placement_lines(out: str) -> dict[str, str]:
    """{node id prefix: its roles} from the controller's rank -> node map."""
    return {m.group(2): m.group(5) for m in map(MAP_LINE.match, out.splitlines()) if m}


def test_two_nodes_train_one_rank_each_and_resume(two_nodes, tiny_model_dir, tiny_task_dir, tmp_path, capsys):
    args = ["trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.save_freq=1", "trainer.val_before_train=False",
            f"ray_kwargs.ray_init.address={two_nodes.address}", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
    final = run(tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "trainer.total_training_steps=2", *args), str(tmp_path / "run"))
    out = capsys.readouterr().out
    with capsys.disabled():  # the map, for the record (pytest -s)
        print("\n" + "\n".join(line for line in out.splitlines() if "rank -> node" in line or MAP_LINE.match(line)))
    nodes = placement_lines(out)
    node_ids = {node["NodeID"][:8] for node in ray.nodes() if node["Alive"]}
    # Node-major: rank 0 on one node, rank 1 on the other, and those are the cluster's two nodes.
    assert sorted(nodes.values()) == ["actor_rollout ranks 0", "actor_rollout ranks 1"] and set(nodes) == node_ids, out
    assert final["training/global_step"] == 2
    assert len(node_ids) == 2 and ray.is_initialized()  # the joined cluster is still up: rlcore did not own it

    final = run(tiny_cfg(tiny_model_dir, tiny_task_dir, tmp_path, "trainer.total_training_steps=3", *args), str(tmp_path / "run2"))
    out = capsys.readouterr().out
    assert f"resumed from {tmp_path}/ckpt/global_step_2 at global step 2" in out and set(placement_lines(out)) == node_ids
    with open(os.path.join(tmp_path, "run2", "metrics.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == [3]
    assert final["training/global_step"] == 3


def test_a_missing_node_is_named_within_the_placement_timeout(two_nodes):
    if not ray.is_initialized():
        ray.init(address=two_nodes.address)
    pool = ResourcePool(nnodes=3, n_gpus_per_node=1, device="cpu", timeout_s=3)
    with pytest.raises(RuntimeError) as info:
        pool.placement_groups()
    message = str(info.value)
    assert message.startswith("Ray placed 2 of trainer.nnodes=3 nodes of {'CPU': 1} ") and "within 3s (trainer.placement_timeout_s)" in message
    assert "The cluster has 2 live node(s), 2 with room for one" in message and "Start 1 more node(s) (ray start --address=...)" in message
    # Nothing is held after the failure: both nodes' CPUs are free again.
    ray.get([ray.remote(num_cpus=1)(lambda: True).options(scheduling_strategy="SPREAD").remote() for _ in range(2)], timeout=60)


def test_colocated_groups_share_each_ranks_node(two_nodes):
    """A critic-like second group on the same two-node pool: rank r of both groups runs on the same node (the same
    bundle), and the two ranks of each group on different nodes."""
    from rlcore.controller.placement import placement_map
    from rlcore.controller.ray_group import RayWorkerGroup
    from rlcore.controller.worker import Worker

    if not ray.is_initialized():
        ray.init(address=two_nodes.address)
    pool = ResourcePool(nnodes=2, n_gpus_per_node=1, device="cpu", max_colocate_count=2, timeout_s=60)
    actor = RayWorkerGroup(Worker, pool, name="actor_rollout")
    critic = RayWorkerGroup(Worker, pool, name="critic")
    try:
        nodes = [node for _, _, node in actor.processes]
        assert [node for _, _, node in critic.processes] == nodes and len(set(nodes)) == 2
        lines = placement_map({"actor_rollout": actor, "critic": critic}).splitlines()
        assert [line.split(": ", 1)[1] for line in lines[1:]] == ["actor_rollout ranks 0; critic ranks 0", "actor_rollout ranks 1; critic ranks 1"]
    finally:
        actor.kill()
        critic.kill()
        pool.release()
