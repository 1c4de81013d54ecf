"""Builds where the CLI runs (`wakeful deploy DIR` of a directory with a Containerfile or a
stack file): the context checked as hostile input (`context`), the builder found and run
(`tools`), the result kept in a bounded build cache (`run`) and sent to the control plane
blob by blob, only what it lacks (`upload`)."""

from .context import ContextRefused, ContextSize, check_context, ignore_patterns
from .run import BuildEnvironment, Built, build, containerfile_of
from .tools import BUILDERS, BuilderError, BuildFailed, find_builder
from .upload import Sent, upload

__all__ = [
    "BUILDERS",
    "BuildEnvironment",
    "BuildFailed",
    "BuilderError",
    "Built",
    "ContextRefused",
    "ContextSize",
    "Sent",
    "build",
    "check_context",
    "containerfile_of",
    "find_builder",
    "ignore_patterns",
    "upload",
]
