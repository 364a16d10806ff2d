// Command gojson decodes inputs as the kubelet decodes its device-manager checkpoint
// (json.Unmarshal into the same types) and prints one JSON line per input: whether Go accepted
// it and, if so, the value re-encoded by json.Marshal. The reliability tests compare the Python
// reader against it. Inputs: the files named as arguments, or else records on stdin, each a
// decimal byte count on a line of its own followed by that many bytes. Test tool only:
// standard library, no kubelet code.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

type devicesPerNUMA map[int64][]string

type podDevicesEntry struct {
	PodUID        string
	ContainerName string
	ResourceName  string
	DeviceIDs     devicesPerNUMA
	AllocResp     []byte
}

type checkpointData struct {
	PodDeviceEntries  []podDevicesEntry
	RegisteredDevices map[string][]string
}

type data struct {
	Data     checkpointData
	Checksum uint64
}

type result struct {
	File  string          `json:"file"`
	OK    bool            `json:"ok"`
	Error string          `json:"error,omitempty"`
	Value json.RawMessage `json:"value,omitempty"`
}

func decode(name string, blob []byte) result {
	r := result{File: name}
	var d data
	if err := json.Unmarshal(blob, &d); err != nil {
		r.Error = err.Error()
	} else if v, err := json.Marshal(d); err != nil {
		r.Error = "marshal: " + err.Error()
	} else {
		r.OK, r.Value = true, v
	}
	return r
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(2)
}

func main() {
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	if len(os.Args) > 1 {
		for _, f := range os.Args[1:] {
			blob, err := os.ReadFile(f)
			if err != nil {
				fail(err)
			}
			if err := enc.Encode(decode(f, blob)); err != nil {
				fail(err)
			}
		}
		return
	}
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadString('\n')
		if err == io.EOF && line == "" {
			return
		} else if err != nil {
			fail(err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			fail(err)
		}
		blob := make([]byte, n)
		if _, err := io.ReadFull(in, blob); err != nil {
			fail(err)
		}
		if err := enc.Encode(decode("-", blob)); err != nil {
			fail(err)
		}
		if err := out.Flush(); err != nil {
			fail(err)
		}
	}
}
