"""The request's side of the wire, in the API server process and beside an in-process engine: text in and out
(tokenizer, detokenizer, stop strings), the client of one or N engine cores, serving metrics. Imports no torch."""
