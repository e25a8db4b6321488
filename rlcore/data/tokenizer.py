"""A character-level tokenizer built offline with the `tokenizers` library (no hub download).

Every printable ASCII character (digits, letters, punctuation, space, newline) is one token, so a prompt of
N characters costs exactly N ids; the chat template adds one id per role marker. Ids are fixed:

    0 <|pad|>   1 <|endoftext|> (eos)   2 <|user|>   3 <|assistant|>   4 <|system|>   5 <|unk|>   6.. characters

Anything else (tabs, non-ASCII) maps to `<|unk|>`, so encode/decode round-trips only the vocabulary above.
"""

from __future__ import annotations

import string

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<|unk|>"
ROLE_TOKENS = ("<|user|>", "<|assistant|>", "<|system|>")
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, *ROLE_TOKENS, UNK_TOKEN)
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"

# `<|role|>content` per message, assistant turns closed by eos, and a trailing `<|assistant|>` to prompt generation.
# A tool result is a user turn `<|user|><tool_response>content</tool_response>`, as Qwen renders tool messages; the
# tags are plain characters (no new ids), so system/user/assistant text and the 102-id vocabulary are unchanged.
# Unknown roles fail loudly instead of being spelled out character by character.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unsupported chat role ' + message['role'] + '; use system, user, assistant or tool') }}"
    "{% endif %}"
    "{% if message['role'] == 'tool' %}{{ '<|user|><tool_response>' + message['content'] + '</tool_response>' }}"
    "{% else %}{{ '<|' + message['role'] + '|>' + message['content'] }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<|endoftext|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_char_tokenizer(model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """Builds the character tokenizer (vocab size 102) with left padding and the chat template above."""
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *CHARACTERS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Split into single characters; `[\s\S]` (not `.`) so that newlines are characters too.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse joins tokens with no separator; the default would put a space between every character.
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        extra_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=model_max_length,
        # Otherwise decode() rewrites " ," -> "," and breaks decode(encode(s)) == s.
        clean_up_tokenization_spaces=False,
    )
