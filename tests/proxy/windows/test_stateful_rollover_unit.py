"""proxy/windows/notes/stateful.py: a rollover that drops previous_response_id keeps each output with its call."""

from proxy.windows.notes.stateful import missing_calls, stateful_input

CALL = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "shell", "arguments": "{}"}
OUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}


def test_an_output_gets_its_call_from_the_journal_without_the_stored_id():
    user = {"role": "user", "content": "next"}
    assert missing_calls([OUT, user]) == ["c1"]
    moved = stateful_input([OUT, user], {"c1": CALL})
    assert moved.items == [{k: v for k, v in CALL.items() if k != "id"}, OUT, user]
    assert (moved.carried, moved.dropped) == (1, 0)


def test_a_call_already_there_is_not_carried_and_an_unknown_output_is_left_out():
    assert missing_calls([CALL, OUT]) == []
    assert stateful_input([CALL, OUT], {}).items == [CALL, OUT]
    custom = {"type": "custom_tool_call_output", "call_id": "c1", "output": "x"}
    moved = stateful_input([custom], {"c1": CALL})  # a call of another kind never answers it
    assert (moved.items, moved.dropped) == ([], 1)
