# Models arrive with the scratchpad issue (SP-1 … SP-12).
