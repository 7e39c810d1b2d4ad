"""Export a trained job: its adapter, or a merged model, with a manifest and a model card.

`export_job(...)` is the one entry point, called by `appliance export` and by
the daemon's control API; `verify_export(folder)` checks an exported folder
against its manifest.
"""

from appliance.errors import ExportError
from appliance.export.exporter import ExportResult, export_job
from appliance.export.manifest import EXPORT_MANIFEST, verify_export

__all__ = ["EXPORT_MANIFEST", "ExportError", "ExportResult", "export_job", "verify_export"]
