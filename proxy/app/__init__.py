"""The process and its front-ends: the command line, the launcher and its workers, status, the views people
read (floor plan: docs/adr/0014-the-floor-plan.md)."""
