"""A run's launch once its nodes are open: the script read for what it cannot train with, every node's preflight,
the code shipped, then the first generation started, all-or-nothing (nothing is left running when a step fails)."""

from __future__ import annotations

from homegpu.remote.events import JobState
from homegpu.remote.jobs.code_filter import CodeFilter
from homegpu.remote.jobs.codesync import SyncError, read_tree, shipping_line, sync_trees
from homegpu.remote.jobs.job_runtimes import LaunchError
from homegpu.remote.jobs.launch_plan import TRAINER_PACKAGE_DIR, local_code, trainer_package
from homegpu.remote.jobs.preflight import run_preflight
from homegpu.remote.jobs.run_backups import RunBackups
from homegpu.remote.jobs.run_generation import Generations
from homegpu.remote.jobs.run_state import RunState
from homegpu.remote.jobs.script_check import keras3_problem, nccl_on_cpu_problem
from homegpu.remote.record import ExperimentLog


class Launch:
    """The steps of a launch between the run's nodes opened and its workers running."""

    def __init__(self, run: RunState, generations: Generations, backups: RunBackups) -> None:
        self.run, self.generations, self.backups = run, generations, backups

    def refuse_keras3(self) -> None:
        """Raises LaunchError when the job's script would train with Keras 3 under the strategy."""
        self._refuse(keras3_problem(self.run.job, self.run.cluster.spec.source, len(self.run.slots)))

    def _refuse(self, problem: str) -> None:
        """Raises LaunchError with `problem`, what reading the script found it cannot train with ("": none)."""
        if problem:
            self.run.publish(JobState.FAILED, "preflight failed")
            raise LaunchError(problem)

    async def go(self, workers: int) -> None:
        """From the nodes open to the workers running: `workers`, as many as the run had before its layout (a
        "per-gpu" job knows its workers only once its nodes are open).

        Raises:
            LaunchError: naming each node that is not ready and what to do.
        """
        run = self.run
        if len(run.slots) != workers:
            self.refuse_keras3()
        self._refuse(nccl_on_cpu_problem(run.job, run.cluster.spec.source, run.plan))
        cache_problem = run.record.describe_setup(run.job, run.launch_lines(), run.pinned)
        if cache_problem:
            run.publish(JobState.PREFLIGHT, cache_problem)
        await self._preflight()
        await self._sync_code()
        run.experiment = ExperimentLog(run.experiments_root, run.run_id)
        self.backups.keep_copies()
        try:
            await self.generations.start()
        except LaunchError:
            run.publish(JobState.FAILED, "start failed")
            raise

    async def _preflight(self) -> None:
        run = self.run
        problems = await run_preflight(run.cluster, run.job, run.run_id, run.slots, run.nodes.runtime,
                                       run.launch_for, local_code(run.job, run.cluster.spec.source), run.plan)
        if problems:
            run.publish(JobState.FAILED, "preflight failed")
            raise LaunchError("; ".join(problems))

    async def _sync_code(self) -> None:
        """Ship the job's code, less homegpu's own output and what its ignore files say (CodeFilter),
        saying what it ships; then homegpu's trainer package beside it (the built-in trainer, and the
        start of a user's script: nodes need no homegpu install) under the code's `_homegpu/`."""
        run = self.run
        nodes = run.sessions()
        try:
            trees = [(await read_tree(trainer_package()), f"/{TRAINER_PACKAGE_DIR}/homegpu/trainer"),
                     (await read_tree(trainer_package() / "report"), f"/{TRAINER_PACKAGE_DIR}/homegpu/report")]
            if not run.job.uses_trainer:
                code = local_code(run.job, run.cluster.spec.source)
                trees.insert(0, (await read_tree(code, CodeFilter(code, run.experiments_root)), ""))
        except SyncError as exc:
            raise LaunchError(f"code sync failed: {exc}") from None
        run.publish(JobState.PREFLIGHT, f"syncing code to {len(nodes)} node(s)" if run.job.uses_trainer
                    else shipping_line(trees[0][0], [node.name for node in nodes]))
        for tree, under in trees:  # one after the other: the job's code sync leaves `_homegpu/` alone
            problems = await sync_trees(tree, [(node, run.code_dir(node.name) + under) for node in nodes])
            if problems:
                raise LaunchError("code sync failed: " + "; ".join(problems))
