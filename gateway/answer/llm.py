"""The LLM answerer: any OpenAI-compatible endpoint, through the `openai` client.

The only module importing openai. The model gets the fitted prompt (gateway/answer/prompt.py)
and its answer is checked (gateway/answer/citations.py): an answer saying it does not know
is `model_declined`; one left without a valid citation is `ungrounded`. Either way it is an
abstention, and neither the model's words nor the evidence reach logs or spans.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import cast

import httpx2
from openai import AsyncOpenAI, OpenAIError
from openai.types.chat import ChatCompletionMessageParam

from gateway.answer.citations import check_citations
from gateway.answer.context import Evidence
from gateway.answer.extractive import Answer
from gateway.answer.prompt import Prompt, build_prompt
from gateway.policy.model import Llm

_DECLINED = re.compile(r"^\W*(i\s+(do\s+not|don't|don’t)\s+know|unknown|no answer)\b", re.I)


class LlmUnavailable(Exception):
    """The endpoint failed or answered nothing usable; the extractive answer serves."""


@dataclass(frozen=True)
class LlmAnswer:
    answer: Answer
    model: str
    blocks_given: int
    prompt_tokens: int  # estimated
    dropped_citations: int


class LlmAnswerer:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        http_client: httpx2.AsyncClient | None = None,
    ) -> None:
        """`http_client` lets tests fake the endpoint at the HTTP transport."""
        self.default_model = model
        self._client = AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "none",  # servers without keys still get a header
            max_retries=0,  # the answer budget, not the client, decides how long to wait
            http_client=http_client,
        )

    def model_for(self, tenant: str, settings: Llm) -> str:
        return settings.tenant_models.get(tenant, self.default_model)

    def prompt(self, question: str, evidence: Sequence[Evidence], settings: Llm) -> Prompt | None:
        return build_prompt(question, evidence, settings.context_tokens, settings.answer_tokens)

    async def answer(self, question: str, prompt: Prompt, model: str, settings: Llm) -> LlmAnswer:
        text = "".join([part async for part in self.stream(prompt, model, settings)])
        return judge(text, prompt, model)

    async def stream(self, prompt: Prompt, model: str, settings: Llm) -> AsyncIterator[str]:
        """The answer's text as the endpoint produces it (unchecked: see `judge`)."""
        try:
            messages = cast(list[ChatCompletionMessageParam], prompt.messages)
            chunks = await self._client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=settings.answer_tokens,
                temperature=settings.temperature,
                stream=True,
            )
            async with chunks:  # closes the connection even if the reader stops early
                async for chunk in chunks:
                    if chunk.choices and chunk.choices[0].delta.content:
                        yield chunk.choices[0].delta.content
        except OpenAIError as exc:
            raise LlmUnavailable(type(exc).__name__) from exc

    async def aclose(self) -> None:
        await self._client.close()


def judge(text: str, prompt: Prompt, model: str) -> LlmAnswer:
    """The model's full text, checked: citations verified and renumbered; an answer that
    declines, or cites nothing it was given, is an abstention."""
    checked = check_citations(text, {b.n for b in prompt.blocks})
    given = len(prompt.blocks)
    if not checked.text or _DECLINED.match(checked.text):
        answer = Answer("", [], True, "model_declined", 0.0)
    elif not checked.cited:
        answer = Answer("", [], True, "ungrounded", 0.0)
    else:
        answer = Answer(checked.text, checked.cited, False, None, 0.0)
    return LlmAnswer(answer, model, given, prompt.tokens, checked.dropped)
