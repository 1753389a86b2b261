"""make_summarize.py — writes summarize.jsonl: 100 short documents for SmolLM2 to summarise
(`medley run examples/summarize.jsonl -o out.jsonl`). 50 news-style paragraphs written by hand
and 50 generated ones (product reviews, meeting notes, match reports, weather and incident
notes) from the fixed lists below, so the file is reproducible: python3 make_summarize.py"""
import json
import random

HAND = [
    "The city council voted on Tuesday to extend the bike lane network by twelve kilometres. Officials said cycling commuters have doubled since 2021 and that the new lanes will connect the university to the central station.",
    "A small bakery in the old town has started giving its unsold bread to a night shelter every evening. The owner said the idea came from a customer who volunteers there.",
    "Researchers measured a two-metre drop in the lake's water level over the dry summer. Farmers downstream have been asked to cut irrigation by a fifth until the autumn rains arrive.",
    "The regional rail operator will replace its oldest diesel trains with battery-electric units by 2027. The new trains can run forty kilometres without overhead wires.",
    "A local library now lends tools as well as books. Members can borrow drills, ladders and sewing machines for up to a week.",
    "Firefighters rescued a family of ducks from a storm drain on Maple Street on Sunday morning. Neighbours had heard the ducklings for hours before calling for help.",
    "The hospital opened a second MRI scanner, cutting the waiting time for scans from nine weeks to four. The machine was paid for partly by a public fundraising campaign.",
    "Students at the technical college built a solar-powered boat that crossed the bay in under two hours. They plan to enter it in a national competition next spring.",
    "The museum will stay open until ten in the evening every Friday this summer. Entry after six will be free for visitors under twenty-five.",
    "Heavy snow closed the mountain pass for the third time this month. Drivers were told to use the tunnel route, which adds about forty minutes to the journey.",
    "A startup from the harbour district has raised four million euros to build software for planning delivery routes. It employs eighteen people and plans to hire ten more.",
    "The town's only cinema will reopen after a two-year renovation with new seats, a larger screen and a small café in the lobby.",
    "Volunteers planted three thousand oak and beech saplings along the river on Saturday. The forestry office expects the new woodland to reduce flooding on nearby fields.",
    "The water company warned that a burst main may cause low pressure in the northern suburbs until Thursday. Bottled water is available at the sports hall.",
    "A ninety-year-old woman completed her first marathon walk, finishing the course in just under eight hours. She said she trained by walking to the market every day.",
    "The school board approved a four-day week pilot for two primary schools. Parents will be surveyed at the end of the year before any wider change.",
    "Archaeologists found the remains of a Roman road beneath a car park during building work. The site will be recorded before construction continues.",
    "The airport reported its busiest August ever, with more than two million passengers. A new security hall is expected to shorten queues next year.",
    "A chess club for seniors has grown from six to sixty members in a year. The club meets twice a week in the community centre and runs a friendly tournament each month.",
    "The ferry service to the island will run hourly instead of every two hours from May. The operator added a second vessel after complaints about crowded crossings.",
    "Police are asking cyclists to register their bikes after a rise in thefts near the station. Registered bikes are far more likely to be returned when found.",
    "The orchestra announced a season of free open-air concerts in the park. The first concert, on the second Sunday of June, will feature music by Dvořák and Sibelius.",
    "A new recycling plant can sort plastic packaging into twelve types using cameras and air jets. The council says it will cut the amount of waste sent to landfill by a third.",
    "The farmers' market moved indoors to the old tram depot for the winter. Stallholders said sales rose because shoppers no longer had to stand in the rain.",
    "A storm brought down power lines in three villages overnight. Engineers restored electricity to most homes by midday, but about two hundred households are still waiting.",
    "The university will offer evening courses in programming for adults who want to change careers. The first course starts in October and has forty places.",
    "A pair of peregrine falcons has nested on the cathedral tower for the fifth year running. A webcam lets the public watch the chicks grow.",
    "The swimming pool will close for six weeks so that its roof can be repaired. Swimmers can use the pool in the neighbouring town at the usual price.",
    "Local bus fares will be capped at two euros per journey from January. The transport authority hopes the cap will bring back passengers lost during the pandemic.",
    "A software bug delayed the publication of exam results by a day. The exam board apologised and said no results had been changed.",
    "The zoo welcomed a baby giraffe, the first born there in eleven years. Keepers said the calf was standing within an hour of its birth.",
    "A company that makes wooden toys is moving its factory from the city centre to a larger site by the motorway. All sixty staff have been offered jobs at the new site.",
    "Record numbers of people signed up for the city's free first-aid courses this year. Organisers credit a social media campaign run by local nurses.",
    "The harbour reopened on Monday after a week of storms kept fishing boats in port. Fishermen said the delay cost them much of the month's catch.",
    "A retired teacher has written a history of the village based on letters found in an attic. The book will be launched at the parish hall next week.",
    "The theatre's production of a new comedy sold out all twenty performances. A second run is planned for the spring.",
    "Scientists at the observatory detected a comet that will be visible with binoculars in late November. It will be brightest just before dawn.",
    "The council will plant wildflowers on road verges instead of mowing them every month. The change should help bees and save money on maintenance.",
    "A dog trained to find lost cats has reunited more than fifty pets with their owners. Its owner runs the service for free at weekends.",
    "The bridge over the canal will be closed to cars for repairs until the end of March. Pedestrians and cyclists can still cross.",
    "A local choir won first prize at an international festival in Vienna. The choir has forty singers aged between sixteen and eighty.",
    "The factory fire was put out after six hours, and no one was injured. Investigators believe it started in a storage room for packaging.",
    "A new app lets residents report potholes with a photo and a location. The roads department says it fixed most reported holes within a week.",
    "Prices at the weekly market rose by about eight percent this year, mostly because of higher costs for fruit and vegetables.",
    "A family-run vineyard won a gold medal for its white wine at a national competition. The owners said the hot, dry summer gave unusually sweet grapes.",
    "The skate park was rebuilt with money raised by the teenagers who use it. They organised car washes and a concert to collect the funds.",
    "The hospital asked visitors to wear masks again after a rise in flu cases. The rule applies to all wards until further notice.",
    "A historic windmill has been restored and is grinding flour again for the first time in fifty years. Visitors can buy the flour at the mill shop.",
    "The electricity network operator will install two thousand new public charging points for electric cars over the next three years.",
    "A lost hiker was found safe after spending the night on the mountain. Rescuers located him using the signal from his phone.",
]

PRODUCTS = ["kettle", "pair of running shoes", "desk lamp", "rice cooker", "backpack", "phone case",
            "electric toothbrush", "garden hose", "coffee grinder", "winter jacket"]
GOOD = ["works well", "feels solid", "is easy to clean", "arrived a day early", "looks better than in the photos"]
BAD = ["is louder than expected", "has a short cable", "scratches easily", "came with unclear instructions",
       "is a bit heavy"]
TEAMS = ["Riverside", "Northgate", "Harbour City", "Old Town", "Westfield", "Hill Park", "Eastbrook",
         "Lakeside"]
TOPICS = ["the office move", "the budget for next year", "the new website", "holiday cover",
          "the customer survey", "the delayed shipment", "hiring a second designer",
          "the security audit"]
PEOPLE = ["Anna", "Marco", "Priya", "Tom", "Lena", "Youssef", "Mei", "Carlos"]
PLACES = ["the coast", "the valley", "the northern hills", "the city", "the islands"]


def generated(rng, k):
    kind = k % 5
    if kind == 0:
        p, g, b = rng.choice(PRODUCTS), rng.choice(GOOD), rng.choice(BAD)
        stars = rng.randint(2, 5)
        return ("Review, %d stars: I bought this %s a month ago. It %s, but it %s. "
                "For the price I would %s." % (stars, p, g, b,
                                               "buy it again" if stars >= 4 else "look elsewhere next time"))
    if kind == 1:
        t, a, b = rng.choice(TOPICS), rng.choice(PEOPLE), rng.choice(PEOPLE)
        return ("Meeting notes: the team discussed %s. %s will prepare a proposal by Friday, and %s "
                "will check the costs with finance. The decision was postponed to next week's "
                "meeting." % (t, a, b if b != a else "the manager"))
    if kind == 2:
        h, a = rng.sample(TEAMS, 2)
        gh, ga = rng.randint(0, 4), rng.randint(0, 4)
        minute = rng.randint(60, 90)
        return ("%s played %s at home on Saturday and the match ended %d-%d. The decisive moment "
                "came in the %dth minute, and the crowd of %d stayed until the final whistle." % (
                    h, a, gh, ga, minute, rng.randint(800, 9000)))
    if kind == 3:
        pl = rng.choice(PLACES)
        return ("Weather for %s: %s in the morning, clearing in the afternoon, highs of %d degrees. "
                "Winds from the %s at %d km/h; %s." % (
                    pl, rng.choice(["fog", "light rain", "showers", "cloud"]), rng.randint(4, 27),
                    rng.choice(["west", "north", "south-east"]), rng.randint(10, 60),
                    rng.choice(["no warnings are in place", "a yellow warning for wind applies on the coast",
                                "frost is likely overnight"])))
    return ("Incident report: at %02d:%02d a %s was reported near %s. Staff %s, and normal "
            "service resumed after %d minutes. No one was hurt." % (
                rng.randint(6, 22), rng.randint(0, 59),
                rng.choice(["water leak", "power cut", "broken lift", "blocked fire exit", "network outage"]),
                rng.choice(["the main entrance", "platform 2", "the staff car park", "the third floor"]),
                rng.choice(["closed the area", "called the contractor", "moved visitors to another room"]),
                rng.randint(10, 120)))


def main():
    rng = random.Random(20261202)
    docs = HAND + [generated(rng, k) for k in range(50)]
    assert len(set(docs)) == 100
    with open("summarize.jsonl", "w") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({
                "custom_id": "doc-%03d" % (i + 1), "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "smollm2-135m", "max_tokens": 48, "temperature": 0,
                         "messages": [{"role": "system", "content": "You summarise documents in one short sentence."},
                                      {"role": "user", "content": "Summarise:\n" + d}]}},
                ensure_ascii=False) + "\n")


main()
