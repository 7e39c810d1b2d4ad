"""Every exception class the appliance defines derives from ApplianceError, but private control flow."""

import importlib
import inspect
import pkgutil

import appliance
from appliance.errors import ApplianceError

# Private exceptions that never leave their module: each is raised and caught there to steer control.
CONTROL_FLOW = {
    "appliance.engines.openai_remote._Failure",  # one request's outcome, turned into a Completion.error
    "appliance.engines.openai_server._ServiceClosed",  # the served model went away; the request gets a 503
    "appliance.service.control._BodyTooLarge",  # the body limit middleware's early exit, answered as a 413
    "appliance.http_listener._PipelinedTooDeep",  # stops the HTTP parser of a connection the listener drops
}


def _exception_classes():
    for module_info in pkgutil.walk_packages(appliance.__path__, "appliance."):
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                yield f"{module.__name__}.{name}", value


def test_every_project_exception_is_an_appliance_error():
    found = dict(_exception_classes())
    assert len(found) > 40  # the walk reached the whole package
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, ApplianceError))
    assert outside == sorted(CONTROL_FLOW)


def test_every_project_error_has_one_base():
    """A kind is caught as what it is: no project error is also a ValueError (or any other builtin)."""
    two_based = sorted(name for name, cls in _exception_classes() if len(cls.__bases__) > 1)
    assert two_based == []
