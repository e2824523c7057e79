"""The macOS backend (seed 004 §4.5): ChatGPT.app's bundled Codex app-server → node_repl/js → @oai/sky."""
