"""The VRAM budget manager: plan, admit, auto-fit and measure a job's memory on one device.

    plan = plan_job(job, student_config, judge_config, probe_device())
    plan.fits, plan.choices, plan.render()

`appliance.budget.memory_ledger` records what the run really uses, next to the plan.
"""

from appliance.budget.device_probe import DeviceInfo, probe_device
from appliance.budget.phase_memory import FitChoices, PhasePlan
from appliance.budget.plan import Plan, plan_job

__all__ = ["DeviceInfo", "FitChoices", "PhasePlan", "Plan", "plan_job", "probe_device"]
