package main

import (
	"encoding/json"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protojson"

	"example.com/berth-go/berth"
	sessionsv1 "example.com/berth-go/gen/berth/sessions/v1"
)

// resolveCase is one environment (and explicit settings) to resolve, as test/clients.test.ts writes it.
type resolveCase struct {
	Env         map[string]string `json:"env"`
	SessionsURL string            `json:"sessions_url"`
	BudgetURL   string            `json:"budget_url"`
	Token       string            `json:"token"`
	TokenFile   string            `json:"token_file"`
}

// resolve answers each case with what Dial finds: {"sessions", "budget", "token"} or {"error"}.
func resolve(in io.Reader, out io.Writer) error {
	var cases []resolveCase
	if err := json.NewDecoder(in).Decode(&cases); err != nil {
		return fmt.Errorf("a JSON array of cases on stdin: %w", err)
	}
	encoder := json.NewEncoder(out)
	for _, c := range cases {
		env := c.Env
		client, err := berth.Dial(berth.Options{
			SessionsURL: c.SessionsURL, BudgetURL: c.BudgetURL, Token: c.Token, TokenFile: c.TokenFile,
			Getenv: func(name string) string { return env[name] },
		})
		var answer facts
		if err != nil {
			answer = facts{"error": err.Error()}
		} else {
			var token interface{}
			if client.Token != "" {
				token = client.Token
			}
			answer = facts{"sessions": client.SessionsURL, "budget": client.BudgetURL, "token": token}
			client.Close()
		}
		if err := encoder.Encode(answer); err != nil {
			return err
		}
	}
	return nil
}

// protojsonEvent is an event as its proto3 JSON (the journal's shape), decoded for a JSON line.
func protojsonEvent(event *sessionsv1.Event) (interface{}, error) {
	data, err := protojson.Marshal(event)
	if err != nil {
		return nil, err
	}
	var value interface{}
	err = json.Unmarshal(data, &value)
	return value, err
}
