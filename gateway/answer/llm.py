"""The LLM answerer: any OpenAI-compatible endpoint, through the `openai` client.

The only module importing openai. The model gets the fitted prompt (gateway/answer/prompt.py)
and its answer is checked (gateway/answer/citations.py): an answer saying it does not know
is `model_declined`; one left without a valid citation is `ungrounded`. Either way it is an
abstention, and neither the model's words nor the evidence reach logs or spans.

An answer is whole only when the endpoint says how it ended (`finish_reason`): one stopped
by a content filter, or a stream that ends without any finish reason (a proxy closing it
after the upstream died), is the endpoint failing; one stopped at its token bound
(`length`) keeps only its whole sentences (`whole_sentences`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncGenerator, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import httpx2

from gateway.answer.citations import MARKER, check_citations, restore_code
from gateway.answer.context import Evidence
from gateway.answer.extractive import Answer, abstain
from gateway.answer.prompt import Prompt, build_prompt
from gateway.errors import GatewayError
from gateway.policy.model import Llm
from gateway.settings import Settings

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

# The model declining, as the prompt asks it to (`I don't know.`) or close to that: the
# whole answer, less its markers and the punctuation around it. An answer that merely
# opens with such words ("Unknown parcels are sent back [1].") is an answer.
# Models often say where they looked ("I don't know based on the provided context."):
# that is still the whole of what they say.
_DECLINED = re.compile(
    r"\W*(i\s+(do\s+not|don't|don’t)\s+know(\s+the\s+answer(\s+to\s+(that|this))?)?"
    r"(,?\s+(based\s+on|from|given|according\s+to|in)\s+(the\s+|this\s+)?"
    r"((provided|given|available)\s+)?(evidence|context|documents?|sources?|information"
    r"|blocks?|passages?))?"
    r"|unknown|no\s+answer)\W*",
    re.I,
)
# Where a sentence may end: its stop, closing quotes or emphasis, and the markers the model
# wrote after it ("5 days. [1]"); then the space and the character that follow, which
# decide (`_sentence_ends`). A full-width stop (`。`) needs no space after it.
_STOP = re.compile(r"([.!?]+|[。！？]+)[\"'”’)*_」』]*(?:\s?\[[\d\s,;]+\])*(?=(\s*)(.?))", re.S)
# A numbered list item's number at the start of a line ("2. "): its stop ends nothing.
_ITEM_NUMBER = re.compile(r"\s*\d{1,3}")
# A line that is a list item or a table row, or is blank (`_line_ends`).
_LISTED = re.compile(r"[ \t]*([-*+•]\s|\d{1,3}[.)]\s|\||\n|$)")


class LlmUnavailable(Exception):
    """The endpoint failed or answered nothing usable; the extractive answer serves."""


class LlmCut(Exception):
    """The endpoint stopped at its token bound (`finish_reason: length`): what it streamed
    ends wherever the bound fell, in the middle of a sentence as likely as not."""


@dataclass(frozen=True)
class Judged:
    answer: Answer
    dropped_citations: int  # cited numbers that named no block the model was given


class LlmAnswerer:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        http_client: httpx2.AsyncClient | None = None,
    ) -> None:
        """`http_client` lets tests fake the endpoint at the HTTP transport."""
        # Imported here: the client's types take half a second to import, which every
        # server start without an LLM would pay.
        from openai import AsyncOpenAI

        self.default_model = model
        self.in_flight = 0  # answers holding a slot (counted on the event loop's thread)
        self._client = AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "none",  # servers without keys still get a header
            max_retries=0,  # the answer budget, not the client, decides how long to wait
            http_client=http_client,
        )

    @classmethod
    def from_settings(
        cls, settings: Settings, transport: httpx2.AsyncBaseTransport | None = None
    ) -> LlmAnswerer | None:
        """The configured endpoint's answerer, or None when GATEWAY_LLM_* leave it off."""
        if not settings.llm_enabled:
            return None
        client = httpx2.AsyncClient(transport=transport) if transport is not None else None
        key = settings.llm_api_key.get_secret_value()
        return cls(settings.llm_base_url, key, settings.llm_model, http_client=client)

    @contextlib.contextmanager
    def slot(self, limit: int) -> Iterator[None]:
        """One of `limit` answers in flight; none free is 503 `llm_busy`, at once: a
        queue in front of a saturated endpoint would only spend every answer's budget."""
        if self.in_flight >= limit:
            raise GatewayError(
                "llm_busy",
                f"{limit} answers are in progress, the most this server runs at once",
                headers={"Retry-After": "1"},
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def model_for(self, tenant: str, settings: Llm) -> str:
        return settings.tenant_models.get(tenant, self.default_model)

    def prompt(self, question: str, evidence: Sequence[Evidence], settings: Llm) -> Prompt | None:
        return build_prompt(question, evidence, settings.context_tokens, settings.answer_tokens)

    async def stream(self, prompt: Prompt, model: str, settings: Llm) -> AsyncGenerator[str]:
        """The answer's text as the endpoint produces it (unchecked: see `judge`); at its
        end, `LlmCut` when the endpoint stopped at `max_tokens`, `LlmUnavailable` when a
        content filter stopped it or the stream ended without saying why."""
        from openai import OpenAIError

        try:
            messages = cast("list[ChatCompletionMessageParam]", prompt.messages)
            chunks = await self._client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=settings.answer_tokens,
                temperature=settings.temperature,
                stream=True,
            )
            seen = False
            finish = None  # the last finish_reason the endpoint gave
            async with chunks:  # closes the connection even if the reader stops early
                async for chunk in chunks:
                    seen = True
                    choice = chunk.choices[0] if chunk.choices else None
                    text = choice.delta.content if choice is not None else None
                    if text is not None and not isinstance(text, str):  # built unchecked
                        raise TypeError("a chunk's content is not text")
                    if choice is not None and choice.finish_reason:
                        finish = choice.finish_reason
                    if text:
                        yield text
            if not seen:  # a body that is no event stream (a proxy's page, a plain JSON
                raise LlmUnavailable("no chunk")  # completion): not the model declining
            # Every OpenAI-compatible server ends an answer with its finish_reason; the
            # client reads `[DONE]` without telling, so no finish reason is a stream cut off.
            if finish is None or finish == "content_filter":
                raise LlmUnavailable("cut off" if finish is None else "content_filter")
            if finish == "length":
                raise LlmCut
        except (LlmUnavailable, LlmCut):
            raise
        except OpenAIError as exc:
            raise LlmUnavailable(type(exc).__name__) from exc
        except Exception as exc:  # a provider (or a proxy) sending what is no chunk
            raise LlmUnavailable(type(exc).__name__) from exc

    async def aclose(self) -> None:
        await self._client.close()


def judge(text: str, prompt: Prompt) -> Judged:
    """The model's full text, checked: citations verified and renumbered; an answer that
    declines, or cites nothing it was given, is an abstention."""
    checked = check_citations(text, {b.n for b in prompt.blocks})
    words = MARKER.sub("", checked.text).strip()  # "[1] I don't know." declines too
    if not words or _DECLINED.fullmatch(words):
        answer = abstain("model_declined")
    elif not checked.cited:
        answer = abstain("ungrounded")
    else:  # code the model copied from its evidence (`buffer\\[0\\]`) as it was written
        answer = Answer(restore_code(checked.text), checked.cited, False, None, 0.0)
    return Judged(answer, checked.dropped)


def whole_sentences(text: str, given: Collection[int]) -> str:
    """An answer cut at its token bound, up to the end of its last whole sentence (or
    line: a list's items end at their line breaks) that cites a given block; "" when none
    does. A sentence cut in the middle is never kept, nor one after the last citation (its
    marker may be what the bound cut off)."""
    kept, start = "", 0
    for end in sorted({*_sentence_ends(text), *_line_ends(text)}):
        if check_citations(text[start:end], given).cited:
            kept = text[:end].rstrip()
        start = end
    return kept


def _sentence_ends(text: str) -> Iterator[int]:
    """Where the sentences of `text` end: after a stop that ends the text, or that space
    and no lower-case letter follow (as gateway/ingest/chunk.py reads "e.g. the"), or after
    a full-width one; never the stop of a list item's number ("2. ")."""
    for stop in _STOP.finditer(text):
        space, following = stop.group(2), stop.group(3)
        line_start = text.rfind("\n", 0, stop.start()) + 1
        if stop.group(1) == "." and _ITEM_NUMBER.fullmatch(text, line_start, stop.start()):
            continue
        wide = stop.group(1)[0] in "。！？"
        if wide or not following or (space and not following.islower()):
            yield stop.end()


def _line_ends(text: str) -> Iterator[int]:
    """Where lines of `text` end that are whole without a stop: a list item or a table
    row once the next line has begun, and a line before a blank line or a list item. (A
    line break inside a sentence, as hard-wrapped prose has, ends nothing.)"""
    for line_break in re.finditer(r"\n", text):
        line = text[text.rfind("\n", 0, line_break.start()) + 1 : line_break.start()]
        if _LISTED.match(line) or _LISTED.match(text, line_break.end()):
            yield line_break.start()
