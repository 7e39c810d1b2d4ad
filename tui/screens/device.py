"""The device: planned vs used bytes per component against the budget, device total and use, phase, time sharing."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from appliance.service.api import JsonObject, SlotStatus
from tui import feeds, polling, views
from tui import messages
from tui.screens.daemon_screen import DaemonScreen
from tui.widgets import formatting
from tui.widgets.memory_bar import MemoryBar

POLL_SECONDS = 2.0


class DeviceScreen(DaemonScreen):
    TITLE = "Device"
    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def body(self) -> ComposeResult:
        yield VerticalScroll(Static("waiting for the daemon…", id="device-empty"), id="slots")

    def on_mount(self) -> None:
        self.start_polling()

    def start_polling(self) -> None:
        polling.poll(self, "device", lambda: feeds.device(self.app.client), POLL_SECONDS)

    async def on_device_loaded(self, message: messages.DeviceLoaded) -> None:
        box = self.query_one("#slots", VerticalScroll)
        slots = message.status.slots
        if len(box.query(".slot-head")) != len(slots):
            await box.remove_children()
            widgets = []
            for slot in slots:
                widgets += [
                    Static("", id=f"slot-head-{slot.index}", classes="slot-head"),
                    MemoryBar(id=f"slot-bar-{slot.index}", classes="slot-bar"),
                ]
            widgets.append(Static("", id="device-foot"))
            await box.mount_all(widgets)
        for slot in slots:
            plan = message.plans.get(slot.job_id or "", {})
            self.query_one(f"#slot-head-{slot.index}", Static).update(slot_head(slot, plan))
            self.query_one(f"#slot-bar-{slot.index}", MemoryBar).show(views.memory_view(slot))
        self.query_one("#device-foot", Static).update(f"disk free {formatting.gib(message.status.disk_free_bytes)}")


def slot_head(slot: SlotStatus, plan: JsonObject) -> Table:
    choices = plan.get("choices") or {}
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        Text(f"{slot.kind} {slot.index}"),
        Text(f"{slot.name}  used {formatting.used_of(slot.used_bytes, slot.total_bytes)}"),
    )
    table.add_row("job", Text(slot.job_id or "idle"))
    if slot.job_id:
        table.add_row("phase", Text(slot.phase or "starting"))
        if "time_share" in choices:
            table.add_row(
                "time sharing",
                "student and engines take turns (sleep/wake)"
                if choices["time_share"]
                else "student and engines stay resident together",
            )
    return table
