"""A search: prune, precompile and time candidates (`search`, `bench`, `placement`), check their outputs
(`outputs`), choose the winner (`selection`), within the tuning session of the context that opened it
(`session`: its state is per context, never the process's)."""
