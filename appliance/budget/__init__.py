"""The VRAM budget manager: plan, admit, auto-fit and measure a job's memory on one device.

    plan = plan_job(job, student_config, judge_config, probe_device())
    plan.fits, plan.choices, plan.render()

`appliance.budget.ledger` (imports torch) records what the run really uses and
survives out-of-memory steps by halving the micro-batch.
"""

from appliance.budget.device import DeviceInfo, probe_device
from appliance.budget.phases import FitChoices, PhasePlan
from appliance.budget.plan import Plan, plan_job

__all__ = ["DeviceInfo", "FitChoices", "PhasePlan", "Plan", "plan_job", "probe_device"]
