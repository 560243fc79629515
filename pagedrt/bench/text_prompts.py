"""Real-text prompts for the speculative-decoding benchmarks (`pagedrt bench latency --prompts
text`, `pagedrt bench throughput --workload text`).

Two kinds, because n-gram prompt lookup can only help where the answer repeats the prompt:

  repeat  the answer copies most of its input: "correct the typos in this paragraph" over a
          ~300-token paragraph (typos put in by `with_typos`, so there is something to
          correct), "add a docstring to this function" over a ~250-token Python function
  novel   the answer owes nothing to the prompt's wording: open questions

The texts are fixed here so that every run and commit measures the same prompts.
"""

from __future__ import annotations

PARAGRAPH = (
    "Lighthouses were once the only way a ship could find a safe harbour at night. The "
    "earliest known light was the Pharos of Alexandria, built around 280 BC on a small island "
    "at the entrance of the city's port. Its fire burned at the top of a stone tower more than "
    "a hundred metres tall, and sailors said they could see it from far out at sea. For "
    "centuries afterwards most lights were simple fires of wood or coal, kept burning by "
    "keepers who lived in small houses beside the tower. In the eighteenth century oil lamps "
    "with polished reflectors made the beams much brighter, and in 1822 the French engineer "
    "Augustin Fresnel designed a lens made of many glass rings that could bend almost all of "
    "the light into a single narrow beam. Fresnel lenses were soon installed along every "
    "busy coast, and some of them are still working today. Each lighthouse was given its own "
    "pattern of flashes, so that a navigator who counted the seconds between them could tell "
    "exactly which light he was looking at. The life of a keeper was lonely and hard: the "
    "lamps had to be trimmed and the glass cleaned every day, and in a storm the keeper might "
    "stay awake all night to make sure the light never went out. Electric lamps and automatic "
    "timers slowly replaced the keepers during the twentieth century, and satellite "
    "navigation has since made many lights unnecessary, but the towers remain some of the "
    "most loved buildings on any coast."
)

CODE = '''def summarize_orders(orders, start_date, end_date, currency="EUR"):
    totals = {}
    counts = {}
    largest = None
    skipped = 0
    for order in orders:
        if order["status"] not in ("paid", "shipped"):
            skipped += 1
            continue
        day = order["created"].date()
        if day < start_date or day > end_date:
            continue
        amount = order["amount"]
        if order["currency"] != currency:
            rate = order.get("exchange_rate")
            if rate is None:
                skipped += 1
                continue
            amount = amount * rate
        customer = order["customer_id"]
        totals[customer] = totals.get(customer, 0.0) + amount
        counts[customer] = counts.get(customer, 0) + 1
        if largest is None or amount > largest[1]:
            largest = (order["id"], amount)
    ranking = sorted(totals.items(), key=lambda item: item[1], reverse=True)
    average = sum(totals.values()) / max(sum(counts.values()), 1)
    return {
        "ranking": ranking,
        "orders_per_customer": counts,
        "average_order": round(average, 2),
        "largest_order": largest,
        "skipped": skipped,
    }
'''

NOVEL = [
    "Write a short story about a robot who learns to paint.",
    "Explain how vaccines train the immune system, in simple words.",
    "Give me ten ideas for a birthday party for a seven-year-old.",
]


def with_typos(text: str, every: int = 12) -> str:
    """`text` with two inner letters swapped in every `every`-th word of five letters or more
    (deterministic)."""
    words = text.split(" ")
    for i in range(every - 1, len(words), every):
        w = words[i]
        if len(w) >= 5 and w[1:3].isalpha():
            words[i] = w[0] + w[2] + w[1] + w[3:]
    return " ".join(words)


def text_prompts() -> dict[str, list[str]]:
    """{"repeat": [...], "novel": [...]}: the user messages (apply a chat template to them)."""
    return {
        "repeat": [
            "Correct the typos in this paragraph and write the whole corrected paragraph:\n\n"
            + with_typos(PARAGRAPH),
            "Add a docstring to this function and write the whole function with it:\n\n"
            + CODE,
        ],
        "novel": list(NOVEL),
    }


def as_prompts(llm, messages: list[str]) -> list[list[int]]:
    """Token ids of each message, through the model's chat template when it has one."""
    tokenizer = llm.get_tokenizer()
    if tokenizer is None:
        raise ValueError("text prompts need a model with a tokenizer (use --model)")
    if getattr(tokenizer, "chat_template", None):
        return [llm.apply_chat_template([{"role": "user", "content": m}], tokenize=True)
                for m in messages]
    return [tokenizer.encode(m) for m in messages]
