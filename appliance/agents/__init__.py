"""Multi-turn agent training: trajectories, environments with tools, and the clients rollouts talk to.

trajectory.py   typed messages (OpenAI shape), Trajectory, TrajectoryGroup
toolcalls.py    the textual tool-call convention, its parser, tool argument checks
tokenize.py     a trajectory as input ids + assistant mask + sampled logprobs
environment.py  the plugin interface (scenarios, async rollout), the tool loop, concurrent groups
engine_client.py the in-process ChatClient over a GenerationEngine (batched)
loading.py      builtin:NAME or file.py:Class from <data-dir>/plugins/
envs/           calculator, email_search (synthetic mailbox), game2048
"""
