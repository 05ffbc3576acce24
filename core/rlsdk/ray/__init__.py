"""rlsdk on Ray (``rlsdk run --ray``, ``pip install 'rlsdk[ray]'``): engines, the trainer and CPU-heavy
grading as Ray actors and tasks, for runs that outgrow one machine or one engine.

The run's loop does not change: :func:`rlsdk.run.ray_wiring.on_ray` swaps the resolved engine for a pool of
engine actors (:mod:`.engine_pool`), the trainer for a trainer actor (:mod:`.trainer_actor`), and installs
Ray tasks as the cluster's pool for CPU-heavy grading (:mod:`.task_pool`). Every worker resolves plugin
names from its own environment, and each node's plugins are checked against the driver's before the first
step (:mod:`.environments`). Nothing here imports Ray until a run asks for it.
"""
