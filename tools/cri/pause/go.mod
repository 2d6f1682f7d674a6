module github.com/rampartnet/rampart/tools/cri/pause

go 1.26.0
