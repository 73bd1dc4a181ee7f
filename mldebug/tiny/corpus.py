"""A small built-in text corpus: enough to train a tiny tokenizer offline.

Written for mldebug; it covers every printable ASCII character so a byte-level tokenizer
trained on it merges common English and code fragments.
"""

from __future__ import annotations

SAMPLE_TEXT = "Tiny models load in 0.5 s: run(x=[1, 2]) -> {'ok': True}; 100% done!"

CORPUS = """\
A tiny model is a real architecture with every dimension made small.
It keeps the code paths of the full model: attention, rotary embeddings, experts, caches.
What it loses is quality, and for debugging that does not matter at all.
The training loop starts in seconds, the debugger attaches to one process, and the bug shows up.
Once the program works, switch back to the full model and check the quality of its output.
Shrink the hidden size, the number of layers, the heads and the feed-forward width.
Keep the constraints: heads divide the hidden size, key/value heads divide the heads.
Top-k routing must not pick more experts than the model has.
Special tokens must stay inside the vocabulary, or the embedding lookup fails.
def forward(self, input_ids, attention_mask=None):
    hidden = self.embed(input_ids) * self.scale
    for layer in self.layers[:2]:
        hidden = layer(hidden, mask=attention_mask)
    return {"logits": self.head(hidden), "loss": None}
x = [i ** 2 for i in range(10) if i % 3 != 0]
path = "/tmp/tiny-model"; size = 1_024; ratio = 3.5e-4 # comment
if a < b and c > d or not (e == f): print(f"{a!r} {b:>8} {c:.2f}")
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 65536 3.14159 -1 +1 2**31.
Punctuation: ! " # $ % & ' ( ) * + , - . / : ; < = > ? @ [ \\ ] ^ _ ` { | } ~
The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.
Loss went from 10.37 to 6.21 after 300 steps; the gradient norm stayed below 1.0.
Rank 0 waits in all_reduce while rank 3 is still in the data loader: a classic hang.
Email: someone@example.com, URL: https://example.com/a/b?c=d&e=f#g, tag: <s> and </s>.
"""
