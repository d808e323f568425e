"""Azure OpenAI's Realtime API: OpenAI's wire at the resource's own URL, with its own key.

Only the connect step differs from OpenAI (docs/providers.md, "Azure OpenAI"):
the GA endpoint is ``wss://RESOURCE.openai.azure.com/openai/v1/realtime?model=
DEPLOYMENT`` (the deployment name goes where the model goes; no
``api-version``), and the key is an ``api-key`` header — or, with ``--azure-auth
bearer``, a Microsoft Entra token sent as ``Authorization: Bearer``. A
transcription model is a deployment too (``--azure-transcription-model``).
"""

from __future__ import annotations

from typing import Final, Literal

from gateway.upstream.base import Upstream
from gateway.upstream.live import GPTLive, is_live_model, live_controls
from gateway.upstream.openai import OpenAIRealtime
from gateway.upstream.provider import (
    ExtraSetting,
    Provider,
    ProviderSettings,
    SimFlavour,
    connect_with,
)

__all__ = ["PROVIDER", "AzureRealtime"]


class AzureRealtime(OpenAIRealtime):
    """An OpenAI Realtime session on an Azure OpenAI resource."""

    provider = "azure"

    def __init__(self, *, auth: str = "api-key", **settings: object) -> None:
        super().__init__(**settings)  # type: ignore[arg-type]
        self.auth = auth

    def headers(self) -> dict[str, str]:
        if not self.api_key:
            return {}
        if self.auth == "bearer":
            return {"Authorization": f"Bearer {self.api_key}"}
        return {"api-key": self.api_key}


_realtime: Final = connect_with(AzureRealtime)


def connect(row: Provider, settings: ProviderSettings, model: str) -> Upstream:
    """A GPT-Live deployment (its name holds ``gpt-live``) on ``/openai/v1/live/sessions``,
    any other on Realtime's ``/openai/v1/realtime``."""
    if is_live_model(model):
        return GPTLive(
            base_url=settings.base_url,
            api_key=settings.api_key,
            model=model,
            auth=getattr(settings, "auth", "api-key"),
            label="Azure OpenAI GPT-Live",
            key_variable=row.key_variable,
            provider=row.name,
        )
    return _realtime(row, settings, model)


PROVIDER: Final = Provider(
    name="azure",
    label="Azure OpenAI Realtime",
    wire="openai",
    connect=connect,
    model_controls=live_controls,
    default_model="",
    base_url="",
    key_variable="AZURE_OPENAI_API_KEY",
    example_base_url="https://RESOURCE.openai.azure.com/openai/v1",
    model_is="deployment",
    # Deployments are named by their owner: no model list; the facts of a deployment
    # named as an OpenAI model are OpenAI's (``providers.facts`` goes by the wire).
    sim=SimFlavour(base="/openai/v1", auth="api-key", needs_model=True, live=True),
    extra=(
        ExtraSetting(
            "auth",
            Literal["api-key", "bearer"],
            "api-key",
            "how the Azure key is sent: api-key (the resource's key) or bearer (a "
            "Microsoft Entra token, as Authorization: Bearer)",
        ),
        ExtraSetting(
            "transcription_model",
            str,
            "gpt-4o-mini-transcribe",
            "the deployment that transcribes a voice session's input (Azure wants a "
            "deployment name)",
        ),
    ),
)
