"""The engine-level runs: the performance harness (`perf`), its plot (`plot`), the GPU parity run of the plugin
against the reference (`parity`), the chat server check (`chat_server`) and the before/after comparison of two
source trees (`compare`)."""
