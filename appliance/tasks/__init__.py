"""Training tasks: problem sources (multiply, GSM8K, JSONL), held-out splits, chat messages, the data cursor."""

from appliance.tasks.task import FewShot, Problem, Task, TaskError
from appliance.tasks.jsonl import load_jsonl_problems
from appliance.tasks.load import load_task
from appliance.tasks.stream import ProblemStream

__all__ = ["FewShot", "Problem", "ProblemStream", "Task", "TaskError", "load_jsonl_problems", "load_task"]
