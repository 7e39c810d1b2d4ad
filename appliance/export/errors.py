"""The export's one error type: the message names the job, checkpoint or file and what to do."""

from appliance.errors import ApplianceError


class ExportError(ApplianceError):
    """The export cannot be made, or an exported folder does not match its manifest."""
