"""bench.gpu.tm_turn_split's pure parts: the uncached count a block cache leaves, the nonce, the table.
(Its requests need LMDeploy's TurboMind: they run on the GPU machine, `run_regress.sh` step `split:tm8b`.)"""

from bench.gpu.tm_turn_split import TurnSplit, common_prefix, split_table, uncached_count, with_nonce


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_uncached_count_is_cut_back_to_whole_blocks() -> None:
    prev = list(range(200))
    ids = prev + [7] * 30
    assert uncached_count(ids, prev, 64) == 230 - 192  # 200 shared: 3 whole blocks of 64 reused
    assert uncached_count(ids, prev, 1) == 30
    assert uncached_count(ids, [], 64) == 230


def test_with_nonce_copies_and_leads_the_first_message() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    out = with_nonce(body, "ab12")
    assert out["messages"][0]["content"] == "[ab12] hi"
    assert out["messages"][1] == {"role": "assistant", "content": "yo"}
    assert body["messages"][0]["content"] == "hi"


def test_split_table_medians_and_ratios() -> None:
    row = TurnSplit(1, prompt_tokens=12000, uncached_tokens=90, template_ms=[8.0, 10.0], encode_ms=[21.0])
    row.ttft_ms = {"gateway": [60.0, 62.0], "chat": [55.0, 57.0], "ids": [20.0, 22.0]}
    row.fresh_ttft_ms = [10.0, 11.0]
    row.reported_prompt_tokens = {"chat": [11500, 11500]}
    row.reported_cached_tokens = {"chat": [11392, None]}
    first = TurnSplit(0, prompt_tokens=11900, uncached_tokens=11900)
    table = split_table([first, row])
    assert "| 1 | 11,900 | 11,900 | - | - | - | - | - |" in table
    second = "| 2 | 12,000 | 90 | 11,392 / 11,500 | 61.0 | 56.0 | 21.0 | 10.5 | 9.0 | 21.0 | 35.0 | 2.00 | 5.81 |"
    assert second in table
