"""Tool calling for the chat API: the request's tools, each family's call format, parsers and grammars."""

from infer.server.tools.formats import ToolFormat, tool_format
from infer.server.tools.request import FunctionTool, ToolRequest, template_messages, tool_request

__all__ = ["FunctionTool", "ToolFormat", "ToolRequest", "template_messages", "tool_format", "tool_request"]
