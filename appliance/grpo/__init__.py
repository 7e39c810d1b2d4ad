"""GRPO: the student, rollouts, advantages, loss, update, the step loop, checkpoints and run_job."""
