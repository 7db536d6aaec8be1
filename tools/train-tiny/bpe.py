"""A Gemma-style BPE tokenizer trained on the corpus: spaces become U+2581, byte fallback for every
character outside the vocabulary, merges within words. Ids 0..108 are Gemma 4's own (special, turn and
channel tokens, newline runs), so the real chat format, stop tokens and answer filter apply unchanged.

Encoding here follows Specula's tokenizer (docs/tokenizer.md): special tokens cut out first, then runs
of newlines and of other characters, then merges lowest rank first. The test
Gemma4TinyModel.TokenizerMatchesTraining checks that both give the same ids.
"""
import heapq
import json
import os
import re
from collections import Counter, defaultdict

SPACE = "\u2581"
HERE = os.path.dirname(os.path.abspath(__file__))
NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6


def gemma4_specials():
    with open(os.path.join(HERE, "gemma4_specials.json")) as fh:
        return [tuple(t) for t in json.load(fh)["tokens"]]


class Tokenizer:
    def __init__(self, tokens, types, merges):
        self.tokens, self.types, self.merges = tokens, types, merges
        self.id = {t: i for i, t in enumerate(tokens)}
        self.rank = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}  # no token holds a plain space
        specials = sorted((t for t, k in zip(tokens, types) if k in (CONTROL, USER_DEFINED)), key=len, reverse=True)
        self.special_re = re.compile("(" + "|".join(re.escape(s) for s in specials) + ")")
        self.cache = {}

    @property
    def bos(self):
        return self.id["<bos>"]

    def _word(self, w):
        """BPE of one segment (a word, with its leading U+2581 if any)."""
        if w in self.cache:
            return self.cache[w]
        syms = []
        for ch in w:
            if ch in self.id:
                syms.append(ch)
            else:
                syms += [f"<0x{b:02X}>" for b in ch.encode("utf-8")]
        while len(syms) > 1:
            best = min(range(len(syms) - 1), key=lambda i: self.rank.get((syms[i], syms[i + 1]), 1 << 30))
            if (syms[best], syms[best + 1]) not in self.rank:
                break
            syms[best:best + 2] = [syms[best] + syms[best + 1]]
        ids = [self.id[s] for s in syms]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        """Ids of text, special tokens parsed (as Specula's encode(text, parse_special = true))."""
        out = []
        for part in self.special_re.split(text):
            if not part:
                continue
            if part in self.id and self.types[self.id[part]] in (CONTROL, USER_DEFINED):
                out.append(self.id[part])
                continue
            for run in re.findall(r"\n+|[^\n]+", part):
                if run[0] == "\n":  # a newline run is a token when it is one, else BPE on its own
                    out += [self.id[run]] if run in self.id else self._word(run)
                    continue
                s = run.replace(" ", SPACE)
                for w in re.findall(f"{SPACE}?[^{SPACE}]*", s):
                    if w:
                        out += self._word(w)
        return out

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            t, k = self.tokens[i], self.types[i]
            if k == BYTE:
                out.append(int(t[3:5], 16))
            elif k == NORMAL:
                out += t.replace(SPACE, " ").encode()
        return out.decode("utf-8", "replace")


def words_of(texts, specials):
    """Word counts of texts as the encoder segments them: U+2581 kept at the start of a word."""
    cut = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    counts = Counter()
    for t in texts:
        for part in cut.split(t):
            for line in part.split("\n"):
                s = line.replace(" ", SPACE)
                counts.update(w for w in re.findall(f"{SPACE}?[^{SPACE}]*", s) if w)
    return counts


def train(texts, vocab_size):
    """Tokens, llama.cpp token types and merges: Gemma 4's ids 0..108, 256 byte tokens, the characters,
    then merged tokens in merge order."""
    specials = gemma4_specials()
    tokens = [t for t, _ in specials]
    types = [k for _, k in specials]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    counts = words_of(texts, [t for t, k in specials if k in (CONTROL, USER_DEFINED)])
    chars = sorted(set("".join(counts)) | {chr(c) for c in range(33, 127)} | {SPACE})
    for c in chars:
        if c not in tokens:
            tokens.append(c)
            types.append(NORMAL)
    merges = ["\n \n"]  # "\n\n" (id 108) as a merge too, as Gemma's tokenizer.json has it

    words = [list(w) for w in counts]
    freq = [counts[w] for w in counts]
    pairs = Counter()
    where = defaultdict(set)
    for i, syms in enumerate(words):
        for a, b in zip(syms, syms[1:]):
            pairs[a, b] += freq[i]
            where[a, b].add(i)
    heap = [(-n, p) for p, n in pairs.items()]
    heapq.heapify(heap)
    known = set(tokens)
    while len(tokens) < vocab_size and heap:
        n, p = heapq.heappop(heap)
        if -n != pairs.get(p, 0) or n == 0:
            continue  # stale entry
        merged = p[0] + p[1]
        merges.append(f"{p[0]} {p[1]}")
        if merged not in known:
            tokens.append(merged)
            types.append(NORMAL)
            known.add(merged)
        changed = Counter()
        for i in list(where[p]):
            syms, f = words[i], freq[i]
            for a, b in zip(syms, syms[1:]):
                changed[a, b] -= f
            j, out = 0, []
            while j < len(syms):
                if j + 1 < len(syms) and syms[j] == p[0] and syms[j + 1] == p[1]:
                    out.append(merged)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            words[i] = out
            for a, b in zip(out, out[1:]):
                changed[a, b] += f
                where[a, b].add(i)
        for q, d in changed.items():
            if d:
                pairs[q] += d
                heapq.heappush(heap, (-pairs[q], q))
        del pairs[p]
    return Tokenizer(tokens, types, merges)


def tokenizer_json(tok):
    """Hugging Face tokenizer.json in Gemma's shape (normalizer Replace ' ' -> U+2581, BPE with byte
    fallback); special tokens as added tokens."""
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, (t, k) in enumerate(zip(tok.tokens, tok.types)) if k in (CONTROL, USER_DEFINED)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
        "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tok.tokens)}, "merges": tok.merges},
    }


def tokenizer_config(chat_template):
    return {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
            "add_bos_token": True, "add_eos_token": False, "chat_template": chat_template,
            "model_max_length": 1024, "tokenizer_class": "GemmaTokenizer"}


def save(tok, path):
    with open(path, "w") as fh:
        json.dump({"tokens": tok.tokens, "types": tok.types, "merges": tok.merges}, fh)


def load(path):
    with open(path) as fh:
        d = json.load(fh)
    return Tokenizer(d["tokens"], d["types"], d["merges"])
