"""The client's screens: jobs, job, compare, device, new job, and the confirm and help modals."""
