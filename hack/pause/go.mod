module duplex.dev/pause

go 1.24
