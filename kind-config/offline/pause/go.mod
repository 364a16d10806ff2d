module devplug.local/pause

go 1.22
