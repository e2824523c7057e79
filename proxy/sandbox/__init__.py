"""The shell's confinement (bubblewrap on Linux, Seatbelt on macOS) and the loader of the user's shell
policy: used by the tool server (floor plan: docs/adr/0014-the-floor-plan.md)."""
