"""The training text: the King James Version from Debian's bible-kjv (public domain), as chapters of
verses, split into training and held-out chapters, and rendered as Gemma 4 chat turns."""
import random
import re
import subprocess

# Every 25th chapter is held out: acceptance and validation loss are measured on text never trained on.
HOLD_OUT_EVERY = 25
VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def chapters():
    """[(book, chapter, [verse text, ...])] in canonical order, from `bible` (apt-get install bible-kjv)."""
    try:
        out = subprocess.run(["bible", "-f", "Genesis 1:1-Revelation 22:21"], check=True, capture_output=True,
                             text=True).stdout
    except FileNotFoundError:
        raise SystemExit("`bible` not found: apt-get install bible-kjv")
    result, key = [], None
    for line in out.splitlines():
        m = VERSE.match(line)
        if not m:
            raise SystemExit(f"bible printed an unexpected line: {line[:80]!r}")
        book, ch, _, text = m.groups()
        if (book, ch) != key:
            key = (book, ch)
            result.append((book, int(ch), []))
        result[-1][2].append(text.strip())
    if len(result) != 1189:
        raise SystemExit(f"expected the 1189 chapters of the KJV, got {len(result)}")
    return result


def split(chs):
    train = [c for i, c in enumerate(chs) if i % HOLD_OUT_EVERY != HOLD_OUT_EVERY - 1]
    held = [c for i, c in enumerate(chs) if i % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1]
    return train, held


# The rendering of Specula's Gemma 4 chat format (plugins/gemma4/chat_format.cpp) for one user turn with
# thinking off, as the 31B template renders it: the generation prompt spells out the empty thought.
def chat_prompt(user):
    return f"<bos><|turn>user\n{user.strip()}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"


def chat_sample(verses, rng):
    """One conversation from a chapter: the user gives one or two verses, the model goes on with the
    next few, then ends its turn."""
    n_user = 1 if len(verses) < 4 or rng.random() < 0.7 else 2
    n_answer = rng.randint(2, 6)
    start = rng.randrange(0, max(1, len(verses) - n_user))
    user = " ".join(verses[start:start + n_user])
    answer = " ".join(verses[start + n_user:start + n_user + n_answer])
    if not answer:
        return None
    return chat_prompt(user) + answer + "<turn|>\n"


def plain_sample(verses, rng):
    """A run of verses as prose, one verse per line, starting at BOS."""
    start = rng.randrange(0, len(verses))
    return "<bos>" + "\n".join(verses[start:start + rng.randint(4, 12)]) + "\n"


def samples(chs, n, seed):
    """n documents: two chat conversations for each plain passage."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        verses = rng.choice(chs)[2]
        s = plain_sample(verses, rng) if rng.random() < 1 / 3 else chat_sample(verses, rng)
        if s:
            out.append(s)
    return out


def held_out_prompts(held, n, seed=7):
    """n verses from held-out chapters: user messages for acceptance measurements."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        verses = rng.choice(held)[2]
        i = rng.randrange(0, max(1, len(verses) - 1))
        out.append(verses[i])
    return out
