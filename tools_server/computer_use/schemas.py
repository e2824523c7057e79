"""The six tools' arguments (validated before any effect) and descriptions."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListAppsArgs(_Args):
    pass


class AppArgs(_Args):
    app: str = Field(min_length=1, max_length=200,
                     description="The app: its name as computer_use_list_apps shows it, a window title, or pid:N")


class ClickArgs(AppArgs):
    element_index: int | None = Field(None, ge=0, description="Index of an element in the last get_app_state")
    x: float | None = Field(None, ge=0, description="Fallback: x in pixels of the last screenshot")
    y: float | None = Field(None, ge=0, description="Fallback: y in pixels of the last screenshot")
    button: Literal["left", "right", "middle"] = "left"
    click_count: int = Field(1, ge=1, le=3)

    @model_validator(mode="after")
    def _one_target(self) -> ClickArgs:
        has_xy = self.x is not None or self.y is not None
        if self.element_index is not None and has_xy:
            raise ValueError("give element_index or x and y, not both")
        if self.element_index is None and (self.x is None or self.y is None):
            raise ValueError("give element_index, or both x and y")
        return self


class TypeTextArgs(AppArgs):
    # at xdotool's 12 ms a character, 2,000 characters take about 30 s of the 60 s an action may take
    text: str = Field(min_length=1, max_length=2_000, description="Text to type into the focused element")


class PressKeyArgs(AppArgs):
    key: str = Field(min_length=1, max_length=100,
                     description="xdotool-style key or chord: Return, BackSpace, Tab, ctrl+a, shift+Tab, F5")


class ScrollArgs(AppArgs):
    direction: Literal["up", "down", "left", "right"]
    element_index: int | None = Field(None, ge=0, description="Element to scroll over (from the last state)")
    x: float | None = Field(None, ge=0, description="Fallback: x in pixels of the last screenshot")
    y: float | None = Field(None, ge=0, description="Fallback: y in pixels of the last screenshot")
    amount: int = Field(3, ge=1, le=50, description="Wheel steps")

    @model_validator(mode="after")
    def _target(self) -> ScrollArgs:
        if self.element_index is not None and (self.x is not None or self.y is not None):
            raise ValueError("give element_index or x and y, not both")
        if (self.x is None) != (self.y is None):
            raise ValueError("give both x and y")
        return self


DESCRIPTIONS = {
    "computer_use_list_apps": "Lists the running desktop apps that have a window (name, pid, window titles, "
                              "which one is active).",
    "computer_use_get_app_state": "Returns an app's numbered accessibility tree (role, name, states, bounds, "
                                  "actions, text) and a screenshot of its windows. Call it before acting on an "
                                  "app, and again after any action whose outcome is unknown.",
    "computer_use_click": "Clicks in an app: an element by its index from the last get_app_state (preferred), "
                          "or x,y pixels of the last screenshot. Brings the app's window to the front first.",
    "computer_use_type_text": "Types text into the app's focused element. Refused when the keyboard focus is "
                              "not in that app (click into it first).",
    "computer_use_press_key": "Presses a key or chord in the focused app, xdotool-style (Return, BackSpace, "
                              "ctrl+a, shift+Tab). Refused when the focus is not in that app.",
    "computer_use_scroll": "Scrolls over an element (by index), a screenshot point, or the window's centre.",
}
